package render

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the components' prometheusrule.yaml from deploy/prometheus's rule files")

// monitoringNamespace is the namespace the NetworkPolicies let reach the admin ports.
const monitoringNamespace = "monitoring"

// images are the images the manifests may run: the Dockerfile's targets, as `make image`
// tags them.
var images = map[string]string{
	"gateway":    "ghcr.io/quotaplane/gateway:0.1.0",
	"rebalancer": "ghcr.io/quotaplane/rebalancer:0.1.0",
	"migrate":    "ghcr.io/quotaplane/ratectl:0.1.0",
}

// checkedKinds is every kind an overlay may render; TestEveryObjectChecked fails on any
// other, so a new object cannot slip in without a check.
var checkedKinds = map[string]string{
	"Deployment":              "checkGateway, checkRebalancer, checkImages",
	"Service":                 "checkServices, checkPrometheusTargets",
	"ConfigMap":               "checkGateway",
	"PodDisruptionBudget":     "checkPDB",
	"ServiceMonitor":          "checkServiceMonitors",
	"PrometheusRule":          "checkPrometheusRule",
	"NetworkPolicy":           "checkNetworkPolicies",
	"HorizontalPodAutoscaler": "checkHPA",
	"Job":                     "checkMigrateJob",
}

func TestEveryObjectChecked(t *testing.T) {
	for region, r := range overlays(t) {
		for _, o := range r.objects {
			if _, ok := checkedKinds[o.Kind]; !ok {
				t.Errorf("%s: %s/%s is a kind no check covers: add one to components_test.go", region, o.Kind, o.Metadata.Name)
			}
		}
	}
}

// TestBaseWithoutCRDs: the base renders core Kubernetes kinds only, so it applies on a
// cluster without the Prometheus Operator; the monitoring objects are components.
func TestBaseWithoutCRDs(t *testing.T) {
	for _, dir := range []string{filepath.Join("..", "base")} {
		m, err := Render(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, res := range m.Resources() {
			group := strings.Split(res.GetApiVersion(), "/")[0]
			if !strings.Contains(res.GetApiVersion(), "/") || group == "apps" || group == "policy" {
				continue
			}
			t.Errorf("%s: %s %s needs API group %s; only core kinds belong in the base", dir, res.GetKind(), res.GetName(), group)
		}
	}
}

func TestComponents(t *testing.T) {
	for region, r := range overlays(t) {
		t.Run(region, func(t *testing.T) {
			t.Run("images", func(t *testing.T) { checkImages(t, r) })
			t.Run("networkpolicies", func(t *testing.T) { checkNetworkPolicies(t, r) })
			t.Run("hpa", func(t *testing.T) { checkHPA(t, r) })
			t.Run("migrate job", func(t *testing.T) { checkMigrateJob(t, r) })
			t.Run("prometheusrule", func(t *testing.T) { checkPrometheusRule(t, r) })
		})
	}
}

// podTemplate is the pod part of a Deployment or a Job.
type podTemplate struct {
	Spec struct {
		Template struct {
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec struct {
				Containers []container `json:"containers"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

func checkImages(t *testing.T, r *rendered) {
	for _, o := range r.objects {
		if o.Kind != "Deployment" && o.Kind != "Job" {
			continue
		}
		var p podTemplate
		if err := json.Unmarshal(o.raw, &p); err != nil {
			t.Fatal(err)
		}
		for _, c := range p.Spec.Template.Spec.Containers {
			want, ok := images[c.Name]
			if !ok {
				t.Errorf("%s: container %s has no known image", o.Metadata.Name, c.Name)
			} else if c.Image != want {
				t.Errorf("%s: container %s runs %s, want %s (what make image builds)", o.Metadata.Name, c.Name, c.Image, want)
			}
		}
	}
}

type networkPolicy struct {
	Spec struct {
		PodSelector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"podSelector"`
		PolicyTypes []string `json:"policyTypes"`
		Ingress     []struct {
			From []struct {
				NamespaceSelector *struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"namespaceSelector"`
				PodSelector *struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"podSelector"`
				IPBlock any `json:"ipBlock"`
			} `json:"from"`
			Ports []struct {
				Port any `json:"port"`
			} `json:"ports"`
		} `json:"ingress"`
	} `json:"spec"`
}

func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return true
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkNetworkPolicies: every pod with an admin port is selected by a policy; the admin
// port is reachable only from the monitoring namespace (no rule opens it to everyone,
// another namespace or an IP block); every other container port stays reachable.
func checkNetworkPolicies(t *testing.T, r *rendered) {
	var pols []networkPolicy
	for _, o := range r.ofKind("NetworkPolicy") {
		var p networkPolicy
		if err := json.Unmarshal(o.raw, &p); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(p.Spec.PolicyTypes, "Ingress") {
			t.Errorf("NetworkPolicy %s: policyTypes %v lacks Ingress", o.Metadata.Name, p.Spec.PolicyTypes)
		}
		if p.Spec.PodSelector.MatchLabels[regionKey] != r.region {
			t.Errorf("NetworkPolicy %s: podSelector lacks %s=%s", o.Metadata.Name, regionKey, r.region)
		}
		pols = append(pols, p)
	}
	for _, o := range r.ofKind("Deployment") {
		var d deployment
		if err := json.Unmarshal(o.raw, &d); err != nil {
			t.Fatal(err)
		}
		labels := d.Spec.Template.Metadata.Labels
		var mine []networkPolicy
		for _, p := range pols {
			if selects(p.Spec.PodSelector.MatchLabels, labels) {
				mine = append(mine, p)
			}
		}
		if len(mine) == 0 {
			t.Errorf("Deployment %s: no NetworkPolicy selects its pods, so its admin port is open to the pod network", o.Metadata.Name)
			continue
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, cp := range c.Ports {
				open, fromOther := false, ""
				for _, p := range mine {
					for _, in := range p.Spec.Ingress {
						covers := len(in.Ports) == 0
						for _, pp := range in.Ports {
							if n, ok := portNumber(c, pp.Port); ok && n == cp.ContainerPort {
								covers = true
							}
						}
						if !covers {
							continue
						}
						open = true
						if len(in.From) == 0 {
							fromOther = "every source"
						}
						for _, f := range in.From {
							ns := f.NamespaceSelector
							if f.IPBlock != nil || ns == nil || ns.MatchLabels["kubernetes.io/metadata.name"] != monitoringNamespace {
								fromOther = "a source outside namespace " + monitoringNamespace
							}
						}
					}
				}
				switch {
				case !open:
					t.Errorf("%s: container port %s (%d) is reachable from nowhere", o.Metadata.Name, cp.Name, cp.ContainerPort)
				case cp.Name == "admin" && fromOther != "":
					t.Errorf("%s: the admin port %d is open to %s", o.Metadata.Name, cp.ContainerPort, fromOther)
				}
			}
		}
	}
}

type hpa struct {
	Spec struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicas *int `json:"minReplicas"`
		MaxReplicas int  `json:"maxReplicas"`
	} `json:"spec"`
}

// checkHPA: the HPA scales this region's gateway Deployment and never below its planned
// count (expected_instances, the fallback's floor for N), and the Deployment leaves the
// count to it (no replicas, which every apply would reset).
func checkHPA(t *testing.T, r *rendered) {
	hs := r.ofKind("HorizontalPodAutoscaler")
	if len(hs) != 1 {
		t.Fatalf("%d HorizontalPodAutoscalers, want 1 (the gateway's)", len(hs))
	}
	var h hpa
	r.must(t, "HorizontalPodAutoscaler", "gateway-"+r.region, &h)
	var d deployment
	r.must(t, "Deployment", "gateway-"+r.region, &d)
	if ref := h.Spec.ScaleTargetRef; ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" || ref.Name != "gateway-"+r.region {
		t.Errorf("HPA scales %s %s %s, want apps/v1 Deployment gateway-%s", ref.APIVersion, ref.Kind, ref.Name, r.region)
	}
	var cm configMap
	for _, o := range r.ofKind("ConfigMap") {
		if strings.HasPrefix(o.Metadata.Name, "gateway-config-") {
			_ = json.Unmarshal(o.raw, &cm)
		}
	}
	var cfg gatewayFile
	if err := yaml.Unmarshal([]byte(cm.Data["gateway.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	switch {
	case h.Spec.MinReplicas == nil:
		t.Error("HPA minReplicas unset (1): below the planned gateway count")
	case *h.Spec.MinReplicas < cfg.ExpectedInstances:
		t.Errorf("HPA minReplicas %d < expected_instances %d", *h.Spec.MinReplicas, cfg.ExpectedInstances)
	case d.Spec.Replicas != nil:
		t.Errorf("Deployment gateway-%s sets replicas %d beside the HPA: every apply resets the count the HPA set", r.region, *d.Spec.Replicas)
	case h.Spec.MaxReplicas <= *h.Spec.MinReplicas:
		t.Errorf("HPA maxReplicas %d <= minReplicas %d: it cannot scale", h.Spec.MaxReplicas, *h.Spec.MinReplicas)
	}
}

type job struct {
	Metadata struct {
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		BackoffLimit            *int `json:"backoffLimit"`
		TTLSecondsAfterFinished *int `json:"ttlSecondsAfterFinished"`
		Template                struct {
			Spec struct {
				RestartPolicy   string `json:"restartPolicy"`
				SecurityContext *struct {
					RunAsNonRoot *bool `json:"runAsNonRoot"`
				} `json:"securityContext"`
				Containers []container `json:"containers"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

// checkMigrateJob: the home region (only) runs `ratectl migrate up` as a Job, with the
// schema owner's database URL from its Secret, hardened like the Deployments.
func checkMigrateJob(t *testing.T, r *rendered) {
	jobs := r.ofKind("Job")
	if r.region != homeRegion {
		if len(jobs) != 0 {
			t.Errorf("%d Jobs in %s: only the home region migrates the one database", len(jobs), r.region)
		}
		return
	}
	if len(jobs) != 1 {
		t.Fatalf("%d Jobs in the home region, want the migration Job", len(jobs))
	}
	var j job
	r.must(t, "Job", "migrate-"+r.region, &j)
	if len(j.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("migration Job: %d containers", len(j.Spec.Template.Spec.Containers))
	}
	c := j.Spec.Template.Spec.Containers[0]
	if len(c.Args) < 2 || c.Args[0] != "migrate" || c.Args[1] != "up" {
		t.Errorf("migration Job args %q, want migrate up", c.Args)
	}
	if s, k := envSecret(t, c, "RATELIMIT_DATABASE_URL"); s != databaseRoles["migrate"].secret || k != "url" {
		t.Errorf("RATELIMIT_DATABASE_URL from secret %s key %s, want the owner's %s key url", s, k, databaseRoles["migrate"].secret)
	}
	if j.Spec.Template.Spec.RestartPolicy != "Never" && j.Spec.Template.Spec.RestartPolicy != "OnFailure" {
		t.Errorf("restartPolicy %q", j.Spec.Template.Spec.RestartPolicy)
	}
	if j.Spec.TTLSecondsAfterFinished == nil {
		t.Error("no ttlSecondsAfterFinished: the finished Job would block the next release's (a Job's template is immutable)")
	}
	if j.Metadata.Annotations["argocd.argoproj.io/hook"] != "PreSync" {
		t.Error("no Argo CD PreSync hook: a sync would start gateways before the migration")
	}
	var d deployment
	if err := json.Unmarshal(jobs[0].raw, &d); err != nil {
		t.Fatal(err)
	}
	if sc := j.Spec.Template.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("migration Job: pod securityContext.runAsNonRoot is not true")
	}
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("migration Job: container not hardened (readOnlyRootFilesystem, allowPrivilegeEscalation)")
	}
}

// ruleSets pairs each rule file of deploy/prometheus with the component that carries it as
// a PrometheusRule: every region's rules with monitoring, the rebalancer's (which fire when
// it is absent) with rebalancer-monitoring, in the home region only.
var ruleSets = []struct {
	rules, component, name string
}{
	{"rules.yml", "monitoring", "quotaplane"},
	{"rebalancer-rules.yml", "rebalancer-monitoring", "quotaplane-rebalancer"},
}

func rulesFileGroups(t *testing.T, file string) any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "prometheus", file))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups any `json:"groups"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if f.Groups == nil {
		t.Fatalf("%s has no groups", file)
	}
	return f.Groups
}

// checkPrometheusRule: each PrometheusRule carries exactly the groups of its rule file (the
// file promtool tests), so the Operator evaluates what the tests cover; the home region has
// the rebalancer's too, the others only the regions'.
func checkPrometheusRule(t *testing.T, r *rendered) {
	want := 1
	if r.region == homeRegion {
		want = 2
	}
	if rs := r.ofKind("PrometheusRule"); len(rs) != want {
		t.Errorf("%d PrometheusRules, want %d", len(rs), want)
	}
	for _, set := range ruleSets[:want] {
		var pr struct {
			Spec struct {
				Groups any `json:"groups"`
			} `json:"spec"`
		}
		o := r.must(t, "PrometheusRule", set.name+"-"+r.region, &pr)
		if !reflect.DeepEqual(pr.Spec.Groups, rulesFileGroups(t, set.rules)) {
			t.Errorf("PrometheusRule %s: groups differ from deploy/prometheus/%s: run cd deploy/render && go test -run TestPrometheusRuleMatchesRulesFile -update ./...", o.Metadata.Name, set.rules)
		}
		checkSelectable(t, o)
	}
}

// operatorRelease is the label kube-prometheus-stack's Prometheus selects ServiceMonitors
// and PrometheusRules by, by default: release=<Helm release name>, as installed with
// `helm install kube-prometheus-stack prometheus-community/kube-prometheus-stack`.
const operatorRelease = "kube-prometheus-stack"

// checkSelectable: a Prometheus Operator object carries the label kube-prometheus-stack
// selects by default (TestReleaseLabelPatch checks that the documented patch changes it).
func checkSelectable(t *testing.T, o object) {
	t.Helper()
	if got := o.Metadata.Labels["release"]; got != operatorRelease {
		t.Errorf("%s %s: label release=%q, want %q (kube-prometheus-stack's default selector)", o.Kind, o.Metadata.Name, got, operatorRelease)
	}
}

// TestPrometheusRuleMatchesRulesFile compares each component's prometheusrule.yaml with its
// rule file, or rewrites it with -update: the file's groups, indented under spec,
// comments kept.
func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	for _, set := range ruleSets {
		t.Run(set.rules, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join("..", "prometheus", set.rules))
			if err != nil {
				t.Fatal(err)
			}
			i := bytes.Index(src, []byte("\ngroups:\n"))
			if i < 0 {
				t.Fatalf("%s: no top-level groups: line", set.rules)
			}
			var b bytes.Buffer
			fmt.Fprintf(&b, `# GENERATED from deploy/prometheus/%s (the file promtool tests): do not edit.
# Regenerate: cd deploy/render && go test -run TestPrometheusRuleMatchesRulesFile -update ./...
# The release label is what kube-prometheus-stack's ruleSelector matches by default; for
# another Helm release name or selector, see docs/operations.md ("Monitoring with
# kube-prometheus-stack").
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: %s
  labels:
    app.kubernetes.io/name: quotaplane
    app.kubernetes.io/component: monitoring
    release: %s
spec:
`, set.rules, set.name, operatorRelease)
			for _, line := range strings.SplitAfter(string(src[i+1:]), "\n") {
				if strings.TrimSpace(line) == "" {
					b.WriteString(line)
					continue
				}
				b.WriteString("  " + line)
			}
			path := filepath.Join("..", "components", set.component, "prometheusrule.yaml")
			if *update {
				if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, b.Bytes()) {
				t.Errorf("%s is not %s's groups: rerun with -update", path, set.rules)
			}
		})
	}
}
