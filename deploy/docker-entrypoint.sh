#!/bin/sh
# The entrypoint of the workd image: refuses the example tokens and cluster
# secret of docker-compose.yml (the words starting with "change-me") unless the
# demo profile is on (COMPOSE_PROFILES, which the compose file passes on to
# every container, names it), then runs the command. The examples are printed
# in a public file: anyone could use them. The profile comes under its own name,
# not a WORKD_* one: those are the options of the binaries this runs.
set -eu
example=""
for word in ${WORKD_TOKENS:-} ${WORKD_TOKEN:-} ${WORKD_CLUSTER_SECRET:-}; do
  case "${word#*:}" in
    change-me*) example="${example} ${word#*:}" ;;
  esac
done
if [ -n "$example" ]; then
  case ",${COMPOSE_PROFILES:-}," in
    *,demo,*)
      echo "workd-entrypoint: WARNING: running with the public example tokens${example};" \
        "this is a demo, not for real use" >&2
      ;;
    *)
      cat >&2 <<MSG
workd-entrypoint: REFUSING TO START: the tokens or secret${example}
are the public examples of docker-compose.yml, known to anyone who read it.
Set your own (16+ characters each), e.g. in an .env file beside the compose file:
    WORKD_CLIENT_TOKEN=\$(openssl rand -hex 16)
    WORKD_WORKER_TOKEN=\$(openssl rand -hex 16)
    WORKD_ADMIN_TOKEN=\$(openssl rand -hex 16)
    WORKD_CLUSTER_SECRET=\$(openssl rand -hex 16)
or, only to try it out, run the demo profile: COMPOSE_PROFILES=demo docker compose up
MSG
      exit 78
      ;;
  esac
fi
exec "$@"
