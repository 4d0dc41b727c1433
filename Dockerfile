# syntax=docker/dockerfile:1.7
# graceguard-webhook: a static (musl) binary on distroless/static, running as
# 65532:65532 with nothing else in the image (no shell, no package manager).
#
#   docker build -t ghcr.io/graceguard/graceguard-webhook:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t ... .
#
# The chart's pods run `graceguard-webhook serve ...` and its helm test runs
# `graceguard-webhook probe --url ...` with this image; neither needs a
# writable filesystem.

ARG RUST_VERSION=1

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS builder
# Set by BuildKit to the platform being built (amd64, arm64).
ARG TARGETARCH
# musl-gcc compiles ring's C and assembly for the musl target.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
RUN case "${TARGETARCH:-amd64}" in \
      amd64) echo x86_64-unknown-linux-musl ;; \
      arm64) echo aarch64-unknown-linux-musl ;; \
      *) echo "unsupported TARGETARCH ${TARGETARCH}" >&2; exit 1 ;; \
    esac > /rust-target \
 && rustup target add "$(cat /rust-target)"
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target,sharing=locked \
    target="$(cat /rust-target)" \
 && export "CC_$(echo "$target" | tr - _)=musl-gcc" \
 && cargo build --release --locked --target "$target" -p graceguard-webhook --bin graceguard-webhook \
 && install -D -m 0755 "target/$target/release/graceguard-webhook" /out/graceguard-webhook \
 && if readelf -l /out/graceguard-webhook | grep -q 'Requesting program interpreter'; then \
      echo "graceguard-webhook is dynamically linked; expected a static binary" >&2; exit 1; \
    fi

FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="graceguard-webhook" \
      org.opencontainers.image.description="Admission webhook: denies pod Creates that collide with an existing or terminating pod before ResourceQuota charges them" \
      org.opencontainers.image.source="https://github.com/graceguard/graceguard" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/graceguard-webhook /graceguard-webhook
USER 65532:65532
# 8443: HTTPS admission reviews; 8080: /healthz, /readyz, /metrics.
EXPOSE 8443 8080
ENTRYPOINT ["/graceguard-webhook"]
CMD ["serve", "--tls-cert=/etc/graceguard/tls/tls.crt", "--tls-key=/etc/graceguard/tls/tls.key"]
