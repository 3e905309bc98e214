// Package regions holds one folder per deployed region (us-east, eu-west): the region's
// gateway configuration (gateway.yaml), its Prometheus scrape configuration
// (prometheus.yml) and its kustomize overlay on deploy/base (kustomization.yaml).
//
// It has no Go API. Its test loads every gateway.yaml with gateway.LoadConfig and checks
// the region it names is the folder's, and runs `promtool check config` on every
// prometheus.yml with the alert rules of deploy/prometheus in place. Rendering the
// overlays is tested by the separate module deploy/render (it needs kustomize, which the
// binaries must not depend on).
//
// It must not import any package of this module but gateway (for its configuration
// loader).
package regions
