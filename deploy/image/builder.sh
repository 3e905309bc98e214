#!/usr/bin/env bash
# Builds the Dockerfile's build-stage image from this machine's Go toolchain, for machines
# that cannot pull golang:1.26-bookworm from a registry: FROM scratch + busybox (Debian's
# busybox-static, for the shell the RUN steps need) + $(go env GOROOT) + the CA
# certificates. Needs buildah. `make image` uses it when GO_IMAGE is this image.
#
#   deploy/image/builder.sh localhost/quotaplane-go:1.26
set -euo pipefail
tag=${1:?usage: builder.sh IMAGE}
: "${BUILDAH:=buildah}"
busybox=$(command -v busybox || true)
[ -n "$busybox" ] || { echo "builder.sh: busybox not found (apt-get install -y busybox-static)" >&2; exit 1; }
if ldd "$busybox" >/dev/null 2>&1; then
  echo "builder.sh: $busybox is dynamically linked; install busybox-static" >&2; exit 1
fi
goroot=$(go env GOROOT)
ctr=$($BUILDAH from scratch)
trap '$BUILDAH rm "$ctr" >/dev/null 2>&1 || true' EXIT
$BUILDAH copy --quiet "$ctr" "$busybox" /bin/busybox
$BUILDAH run --isolation chroot "$ctr" -- /bin/busybox sh -c \
  'for a in sh mkdir cp echo chmod cat ls rm ln mv true env; do /bin/busybox ln -s busybox /bin/$a; done; /bin/busybox mkdir -p -m 1777 /tmp; /bin/busybox mkdir -p /go'

$BUILDAH copy --quiet "$ctr" "$goroot" /usr/local/go
$BUILDAH copy --quiet "$ctr" /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
$BUILDAH config --env PATH=/usr/local/go/bin:/bin --env GOPATH=/go --env GOCACHE=/tmp/gocache \
  --env GOPROXY="$(go env GOPROXY)" --env GOTOOLCHAIN=local "$ctr"
$BUILDAH commit --quiet "$ctr" "$tag" >/dev/null
echo "builder.sh: built $tag from $goroot ($(go env GOVERSION))"
