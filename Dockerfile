# workd images: one multi-stage build for workd-server, workd-worker, workd-demo
# and workd (the command line). The build stage has the compilers; the runtime
# stage has only the shared libraries the binaries link, curl for healthchecks
# and the entrypoint.
#   docker build -t workd:latest .      (docker-compose.yml builds it too)
FROM debian:12 AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake pkg-config \
      libmicrohttpd-dev libjansson-dev libpq-dev libcurl4-openssl-dev libssl-dev libjemalloc-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY common common
COPY server server
COPY worker worker
COPY demo demo
COPY cli cli
COPY migrations migrations
COPY dashboard dashboard
# WORKD_TESTS=OFF: the test suite (cmocka, python3) is not part of an image.
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWORKD_TESTS=OFF >/dev/null \
 && cmake --build build -j"$(nproc)" --target workd-server workd-worker workd-demo workd \
 && strip --strip-debug build/bin/workd-server build/bin/workd-worker build/bin/workd-demo \
      build/bin/workd

FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libmicrohttpd12 libjansson4 libpq5 libcurl4 libssl3 \
      libjemalloc2 \
      ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/bin/workd-server /src/build/bin/workd-worker \
     /src/build/bin/workd-demo /src/build/bin/workd /usr/local/bin/
COPY LICENSE /usr/share/doc/workd/LICENSE
COPY deploy/docker-entrypoint.sh /usr/local/bin/workd-entrypoint
USER nobody
EXPOSE 8080
ENTRYPOINT ["workd-entrypoint"]
CMD ["workd-server", "--listen", "0.0.0.0:8080"]
