// Package render builds the kustomize overlays of deploy/regions exactly as
// `kustomize build` does (sigs.k8s.io/kustomize/api, in process), and its test checks what
// they render: region names, secret references instead of inlined URLs, each workload's database
// Secret that of its role (only the migration reads the owner's) and deploy/secrets'
// generators making exactly the Secrets each region reads, probes, the
// PodDisruptionBudget, the ServiceMonitors, the rebalancer in the home region only, that
// each region's prometheus.yml finds the Services the overlay renders, and the components
// of deploy/components: the NetworkPolicies (admin ports from the monitoring namespace
// only), the HPA (never below expected_instances, and no replicas beside it), the migration
// Job (home region only), the PrometheusRules (equal to deploy/prometheus's rule files; the
// rebalancer's in the home region only) and the ServiceMonitors with the label
// kube-prometheus-stack selects, the images, and that the base alone needs no CRD. Every
// rendered kind must have a check. It also runs what the docs tell a team to run on a copy
// of the tree: `kustomize edit set image` (with the kustomize CLI's code) must make every
// container run the team's image, and the release-label patch must relabel every
// Prometheus Operator object.
//
// It is its own Go module (deploy/render/go.mod) so that kustomize and its dependencies
// stay out of the module graph of the binaries; the main module's `go list ./...` does not
// see it. Run its tests with `cd deploy/render && go test ./...`.
//
// It must not import the main module: it reads the deploy/ files (and the docs) from disk.
package render
