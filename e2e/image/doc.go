// Package image tests the container images of the Dockerfile: it builds the gateway image
// with buildah (deploy/image/build.sh, the script behind `make image`, from the local Go
// toolchain so no registry is needed), checks what the image holds (a static binary, CA
// certificates, a non-root user, nothing else), and runs the image's gateway against a
// test Redis and PostgreSQL: it must become ready (its own `healthcheck` subcommand, run in
// the image, says so), proxy, throttle, and serve quotaplane_build_info with the stamp.
//
// buildah runs on a storage of the test's own, removed at the end with every image and
// cache the build made: `make image-test` leaves nothing behind, and every run is a cold
// build.
//
// It runs in `make image-test` (part of `make test`), not with the race-detector packages:
// a cold build compiles the module for about 4 minutes on two cores. It needs buildah and
// busybox-static (deploy/install-deps.sh installs them) and root, or a user buildah can
// run as; it fails, never skips, when they are missing.
package image
