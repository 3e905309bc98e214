// Package deploycheck checks what deploy/ ships against real tools, so that `make test`
// covers the deployment files although deploy/ holds no Go:
//
//   - the Grafana dashboard (deploy/dashboards/quotaplane.json): Queries gives every panel
//     query with its template variables filled in; the tests check that a real Prometheus
//     accepts each and that every metric they name is one the Go code registers (the
//     end-to-end stack test requires each to return data);
//   - the Prometheus rules (deploy/prometheus/rules.yml, and rebalancer-rules.yml for the
//     home region): `promtool check rules`, `promtool test rules` on each NAME_test.yml,
//     and that those tests make every alert fire (absence alerts over no series at all);
//   - compose.yaml: images built from the Dockerfile's targets, a healthcheck for every
//     long-running service, the start order, the mounted files;
//   - every region folder (deploy/regions/*): its gateway.yaml loads with
//     gateway.LoadConfig and names the folder's region, and `promtool check config`
//     accepts its prometheus.yml with the alert rules in place.
//
// Rendering the kustomize overlays is tested by the separate module deploy/render. This
// package reads the files from the source tree (DeployDir); it imports only gateway (the
// configuration loader) and, in tests, internal/testenv.
package deploycheck
