#!/bin/sh
# Patroni runs this once, on the node that initialised the cluster, with a
# superuser connection URL as $1: workd's role and database. pg_monitor lets
# workd see which standbys are synchronous (GET /cluster, /readyz).
set -eu
psql -X -v ON_ERROR_STOP=1 -v pw="${WORKD_DB_PASSWORD:?}" -d "$1" <<'SQL'
CREATE ROLE workd LOGIN PASSWORD :'pw';
GRANT pg_monitor TO workd;
CREATE DATABASE workd OWNER workd;
SQL
