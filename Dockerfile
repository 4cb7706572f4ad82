# workd images: one multi-stage build for workd-server, workd-worker and workd-demo.
FROM debian:12 AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake pkg-config \
      libmicrohttpd-dev libjansson-dev libpq-dev libcurl4-openssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY common common
COPY server server
COPY worker worker
COPY demo demo
COPY migrations migrations
COPY tests/CMakeLists.txt tests/CMakeLists.txt
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo \
 && cmake --build build -j"$(nproc)" --target workd-server workd-worker workd-demo

FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libmicrohttpd12 libjansson4 libpq5 libcurl4 \
      ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/bin/workd-server /src/build/bin/workd-worker \
     /src/build/bin/workd-demo /usr/local/bin/
USER nobody
EXPOSE 8080
CMD ["workd-server", "--listen", "0.0.0.0:8080"]
