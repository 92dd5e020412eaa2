# syntax=docker/dockerfile:1
# fairgate container image: build with the Rust toolchain, run on a slim Debian as a non-root user.
#   docker build -t fairgate .
#   docker run -p 8080:8080 -v "$PWD/config.toml:/etc/fairgate/config.toml:ro" fairgate
# The mounted config must listen on 0.0.0.0:8080 (not 127.0.0.1) to be reachable from outside;
# the HEALTHCHECK asks /readyz on that port (curl is installed in the runtime image for it).

FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
    && install -m 0755 target/release/fairgate /usr/local/bin/fairgate

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --no-create-home --shell /usr/sbin/nologin fairgate \
    && mkdir -p /etc/fairgate
COPY --from=build /usr/local/bin/fairgate /usr/local/bin/fairgate
USER fairgate
EXPOSE 8080
# Healthy once the server listens with a valid config (/readyz 200); unhealthy while it drains.
# A config that listens elsewhere or with TLS overrides this with `docker run --health-cmd`.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD curl -fsS -o /dev/null http://127.0.0.1:8080/readyz || exit 1
ENTRYPOINT ["fairgate"]
CMD ["serve", "--config", "/etc/fairgate/config.toml"]
