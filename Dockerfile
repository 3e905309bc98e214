# syntax=docker/dockerfile:1
# quotaplane images: one per binary, all from this file, each FROM scratch (a static
# CGO_ENABLED=0 binary, CA certificates, a non-root user; no shell, no package manager):
#
#   docker build --target gateway    -t ghcr.io/quotaplane/gateway:0.1.0 .
#   docker build --target rebalancer -t ghcr.io/quotaplane/rebalancer:0.1.0 .
#   docker build --target ratectl    -t ghcr.io/quotaplane/ratectl:0.1.0 .
#
# or `make image`, which builds all three with docker, podman or buildah, whichever is
# present, and stamps VERSION, COMMIT and DATE (shown by --version). GO_IMAGE is the build
# stage's image: any image with Go 1.26 and a POSIX shell. On a machine that cannot pull
# it, `make image GO_IMAGE=local` builds one from the local Go toolchain
# (deploy/image/builder.sh, with buildah).
#
# The build stage downloads the Go modules (go mod download), so it needs a Go module
# proxy it can reach: GOPROXY, the public proxy by default. Offline, run one on your
# network and build with GO_IMAGE=local: its image carries this machine's `go env GOPROXY`.
#
# No HEALTHCHECK here (OCI images do not keep one, and Kubernetes probes over HTTP): the
# binaries check themselves, `gateway healthcheck` and `rebalancer healthcheck`, as
# compose.yaml does.

ARG GO_IMAGE=golang:1.26-bookworm

FROM ${GO_IMAGE} AS build
ARG VERSION=dev
ARG COMMIT=unknown
ARG DATE=unknown
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local \
    GOCACHE=/root/.cache/go-build GOMODCACHE=/go/pkg/mod
# Modules first: this layer is reused until go.mod or go.sum changes. The cache mounts keep
# the module and build caches between builds (BuildKit, podman and buildah support them).
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    set -eu; \
    pkg=github.com/quotaplane/quotaplane/internal/version; \
    ld="-s -w -X $pkg.version=$VERSION -X $pkg.commit=$COMMIT -X $pkg.date=$DATE"; \
    mkdir -p /out; \
    for b in gateway rebalancer ratectl; do \
      go build -trimpath -ldflags "$ld" -o /out/$b ./cmd/$b; \
    done; \
    /out/gateway --version
# The files the scratch images need: CA certificates (TLS to PostgreSQL, Redis and the
# upstreams) and a passwd/group naming the non-root user 65532 (the UID the Kubernetes
# manifests run as), so ratectl can name it in the audit log.
RUN set -eu; mkdir -p /rootfs/etc/ssl/certs /rootfs/tmp; \
    cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/; \
    echo 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' > /rootfs/etc/passwd; \
    echo 'nonroot:x:65532:' > /rootfs/etc/group; \
    chmod 1777 /rootfs/tmp

FROM scratch AS base
COPY --from=build /rootfs/ /
USER 65532:65532
LABEL org.opencontainers.image.source="https://github.com/quotaplane/quotaplane"

FROM base AS rebalancer
COPY --from=build /out/rebalancer /usr/local/bin/rebalancer
EXPOSE 9102
ENTRYPOINT ["/usr/local/bin/rebalancer"]

FROM base AS ratectl
COPY --from=build /out/ratectl /usr/local/bin/ratectl
ENTRYPOINT ["/usr/local/bin/ratectl"]

# Last, so a plain `docker build .` makes the gateway.
FROM base AS gateway
COPY --from=build /out/gateway /usr/local/bin/gateway
EXPOSE 8080 9100
ENTRYPOINT ["/usr/local/bin/gateway"]
CMD ["--config", "/etc/quotaplane/gateway.yaml"]
