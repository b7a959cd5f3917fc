# syntax=docker/dockerfile:1
#
# mcp-resume-proxy: a multi-stage build. The build stage compiles with the committed Cargo.lock
# (--locked); the runtime stage is Debian slim with the binary only, run as a non-root user.
#
#   docker build -t mcp-resume-proxy .
#   docker run --rm -p 8080:8080 -p 9090:9090 mcp-resume-proxy \
#     run --upstream http://host.docker.internal:8000/sse \
#         --listen 0.0.0.0:8080 --admin-listen 0.0.0.0:9090 --data-dir /data

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS build
WORKDIR /src
# The committed lockfile pins every dependency; --locked fails the build if it is stale.
COPY Cargo.toml Cargo.lock ./
COPY . .
RUN cargo build --release --locked --bin mcp-resume-proxy \
    && install -D -m 0755 target/release/mcp-resume-proxy /out/mcp-resume-proxy

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
# A fixed non-root uid/gid (65532, as distroless "nonroot"), matching the Helm chart's
# securityContext, and a data directory it owns.
RUN groupadd --system --gid 65532 proxy \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin proxy \
    && mkdir -p /data && chown 65532:65532 /data
COPY --from=build /out/mcp-resume-proxy /usr/local/bin/mcp-resume-proxy
USER 65532:65532
WORKDIR /data
# The event log (sled). Mount a volume here; the root filesystem can stay read-only.
VOLUME /data
# 8080: clients (legacy /sse + /messages, Streamable HTTP /mcp); 9090: /metrics, /healthz, /readyz.
EXPOSE 8080 9090
# SIGTERM starts the graceful drain ([shutdown] grace_secs).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/mcp-resume-proxy"]
CMD ["run", "--listen", "0.0.0.0:8080", "--admin-listen", "0.0.0.0:9090", "--data-dir", "/data"]
