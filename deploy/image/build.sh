#!/usr/bin/env bash
# Builds the images of the Dockerfile (`make image`): with docker if its engine answers,
# else podman, else buildah (CONTAINER_TOOL overrides), each target tagged
# $REGISTRY/<target>:$TAG (the overlays' images: lists default to ghcr.io/quotaplane/NAME:0.1.0;
# `kustomize edit set image` points them at yours: docs/operations.md step 1), with
# version, commit and date stamped into the binaries. The build stage downloads the Go
# modules: it needs a Go module proxy it can reach (GOPROXY).
#
#   deploy/image/build.sh                  # gateway, rebalancer, ratectl
#   deploy/image/build.sh gateway          # one target
#
# Environment: REGISTRY (ghcr.io/quotaplane), TAG (0.1.0), VERSION (v$TAG), COMMIT and DATE
# (from git and the clock), GO_IMAGE (golang:1.26-bookworm; "local" builds the build-stage
# image from this machine's Go toolchain with deploy/image/builder.sh, for machines without
# registry access; needs buildah), CONTAINER_TOOL, STORAGE_DRIVER (buildah/podman: vfs
# where overlay is unavailable, as inside a container).
set -euo pipefail
cd "$(dirname "$0")/../.."

REGISTRY=${REGISTRY:-ghcr.io/quotaplane}
TAG=${TAG:-0.1.0}
VERSION=${VERSION:-v$TAG}
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
DATE=${DATE:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}
GO_IMAGE=${GO_IMAGE:-golang:1.26-bookworm}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gateway rebalancer ratectl)

tool=${CONTAINER_TOOL:-}
if [ -z "$tool" ]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    tool=docker
  elif command -v podman >/dev/null 2>&1; then
    tool=podman
  elif command -v buildah >/dev/null 2>&1; then
    tool=buildah
  else
    echo "build.sh: no docker engine, podman or buildah; install one (Debian: apt-get install -y buildah)" >&2
    exit 1
  fi
fi

storage=()
if [ -n "${STORAGE_DRIVER:-}" ] && [ "$tool" != docker ]; then
  storage=(--storage-driver "$STORAGE_DRIVER")
fi

if [ "$GO_IMAGE" = local ]; then
  GO_IMAGE=localhost/quotaplane-go:$(go env GOVERSION)
  BUILDAH="buildah ${storage[*]}" deploy/image/builder.sh "$GO_IMAGE"
fi

case "$tool" in
  docker) build=(docker build) ;;
  podman) build=(podman "${storage[@]}" build) ;;
  # chroot isolation: works without user namespaces (inside a container, in CI).
  buildah) build=(buildah "${storage[@]}" bud --isolation chroot --layers) ;;
  *) echo "build.sh: CONTAINER_TOOL=$tool: want docker, podman or buildah" >&2; exit 1 ;;
esac

for target in "${targets[@]}"; do
  image="$REGISTRY/$target:$TAG"
  echo "build.sh: $tool: $image ($VERSION, commit ${COMMIT:0:12})" >&2
  "${build[@]}" --target "$target" \
    --build-arg GO_IMAGE="$GO_IMAGE" --build-arg VERSION="$VERSION" \
    --build-arg COMMIT="$COMMIT" --build-arg DATE="$DATE" \
    -t "$image" .
done
