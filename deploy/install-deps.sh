#!/usr/bin/env bash
# Installs the real servers that the tests and the demo start: redis-server (and
# redis-sentinel), PostgreSQL, Prometheus (with promtool), nginx (in front of the check
# endpoint), the headless Chromium that drives the status page's browser test, and
# buildah for the image test, from Debian's packages. Installs only what is missing.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || need+=(redis-tools)
command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  need+=(postgresql)
fi
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
# make image-test: buildah builds the images; busybox-static is the shell of the build stage
# made from the local Go toolchain (deploy/image/builder.sh).
command -v buildah >/dev/null 2>&1 || need+=(buildah)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || need+=(busybox-static)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
# Unique names, in order.
mapfile -t need < <(printf '%s\n' "${need[@]}" | awk '!seen[$0]++')
if [ "$(id -u)" -ne 0 ]; then
  echo "missing packages; run: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
echo "installing: ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d keeps the packages from starting system services on the standard ports.
policy=/usr/sbin/policy-rc.d
created=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created=1
fi
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
[ "$created" -eq 1 ] && rm -f "$policy"
exit 0
