# syntax=docker/dockerfile:1
# fairgate's container image: built with the Rust toolchain, run on distroless (glibc and CA
# certificates, no shell, no package manager, no curl) as the non-root user 65532.
#
#   docker build -t fairgate \
#     --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ) .
#   docker run -p 8080:8080 -v "$PWD/config.toml:/etc/fairgate/config.toml:ro" fairgate
#
# The mounted config must listen on 0.0.0.0:8080 (not 127.0.0.1) to be reachable from outside.
# Base images are pinned by digest (both Debian 12, so the binary's glibc is the runtime's);
# to move them, replace tag and digest together.

ARG RUST_IMAGE=rust:1.95-slim-bookworm@sha256:d7482085ff5b415f84dba5647ae71606650bdef00db7aeb69f4b3d170c3e4082
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
# The release profile ships no debug info and no symbol table (Cargo.toml).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
    && install -m 0755 target/release/fairgate /usr/local/bin/fairgate

FROM ${RUNTIME_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="fairgate" \
      org.opencontainers.image.description="A reverse proxy for OpenAI-compatible LLM APIs that keeps many tenants fair on one shared provider" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="gcr.io/distroless/cc-debian12:nonroot"
COPY --from=build /usr/local/bin/fairgate /usr/local/bin/fairgate
USER 65532:65532
EXPOSE 8080
# The binary is its own health check: 0 once /readyz answers 200 (a valid config, listening),
# 1 while it drains or is down. A config that listens elsewhere or with TLS overrides it, e.g.
#   docker run --health-cmd '/usr/local/bin/fairgate health --url https://127.0.0.1:8443/readyz --ca-file /etc/fairgate/ca.pem'
# Kubernetes ignores HEALTHCHECK: its probes ask /readyz and /healthz themselves.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/fairgate", "health", "--url", "http://127.0.0.1:8080/readyz", "--timeout-ms", "2500"]
ENTRYPOINT ["/usr/local/bin/fairgate"]
CMD ["serve", "--config", "/etc/fairgate/config.toml"]
