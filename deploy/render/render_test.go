package render

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

const (
	// homeRegion runs the rebalancer; every other region runs gateways only.
	homeRegion = "us-east"
	namespace  = "quotaplane"
	regionKey  = "quotaplane.io/region"
	// The Secret of each region's Redis, which the manifests reference and never contain
	// (deploy/base/README.md); the database's are databaseRoles (roles_test.go).
	redisSecretFmt = "quotaplane-redis-%s"
)

// The regions that must have an overlay; any other folder with one is checked too.
var wantRegions = []string{"us-east", "eu-west"}

// Values that only a credential-bearing URL would put into a manifest.
var secretMarkers = []string{"redis://", "rediss://", "postgres://", "postgresql://", "password="}

// object is the part of any rendered resource the checks read; raw keeps all of it.
type object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	raw []byte
}

type probe struct {
	HTTPGet *struct {
		Path string `json:"path"`
		Port any    `json:"port"` // a name or a number
	} `json:"httpGet"`
}

type container struct {
	Name  string   `json:"name"`
	Image string   `json:"image"`
	Args  []string `json:"args"`
	Ports []struct {
		Name          string `json:"name"`
		ContainerPort int    `json:"containerPort"`
	} `json:"ports"`
	Env []struct {
		Name      string `json:"name"`
		Value     string `json:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `json:"name"`
				Key  string `json:"key"`
			} `json:"secretKeyRef"`
		} `json:"valueFrom"`
	} `json:"env"`
	EnvFrom []struct {
		SecretRef *struct {
			Name string `json:"name"`
		} `json:"secretRef"`
	} `json:"envFrom"`
	LivenessProbe  *probe `json:"livenessProbe"`
	ReadinessProbe *probe `json:"readinessProbe"`
	Lifecycle      *struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `json:"seconds"`
			} `json:"sleep"`
		} `json:"preStop"`
	} `json:"lifecycle"`
	Resources struct {
		Requests map[string]string `json:"requests"`
		Limits   map[string]string `json:"limits"`
	} `json:"resources"`
	SecurityContext *struct {
		RunAsNonRoot             *bool `json:"runAsNonRoot"`
		ReadOnlyRootFilesystem   *bool `json:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `json:"allowPrivilegeEscalation"`
	} `json:"securityContext"`
	VolumeMounts []struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
	} `json:"volumeMounts"`
}

type deployment struct {
	Spec struct {
		Replicas *int `json:"replicas"`
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec struct {
				TerminationGracePeriodSeconds *int `json:"terminationGracePeriodSeconds"`
				SecurityContext               *struct {
					RunAsNonRoot *bool `json:"runAsNonRoot"`
				} `json:"securityContext"`
				Containers []container `json:"containers"`
				Volumes    []struct {
					Name      string `json:"name"`
					ConfigMap *struct {
						Name string `json:"name"`
					} `json:"configMap"`
				} `json:"volumes"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

type service struct {
	Spec struct {
		ClusterIP string            `json:"clusterIP"`
		Selector  map[string]string `json:"selector"`
		Ports     []servicePort     `json:"ports"`
	} `json:"spec"`
}

type servicePort struct {
	Name       string `json:"name"`
	Port       int    `json:"port"`
	TargetPort any    `json:"targetPort"`
}

type pdb struct {
	Spec struct {
		MinAvailable   any `json:"minAvailable"`
		MaxUnavailable any `json:"maxUnavailable"`
		Selector       struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
	} `json:"spec"`
}

type serviceMonitor struct {
	Spec struct {
		JobLabel string `json:"jobLabel"`
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port        string `json:"port"`
			Path        string `json:"path"`
			HonorLabels bool   `json:"honorLabels"`
		} `json:"endpoints"`
	} `json:"spec"`
}

type configMap struct {
	Data map[string]string `json:"data"`
}

// gatewayFile is the part of gateway.yaml the manifests must agree with.
type gatewayFile struct {
	Region            string `json:"region"`
	Listen            string `json:"listen"`
	AdminListen       string `json:"admin_listen"`
	DatabaseURL       string `json:"database_url"`
	ExpectedInstances int    `json:"expected_instances"`
	DrainTimeout      string `json:"drain_timeout"`
	Redis             struct {
		URL string `json:"url"`
	} `json:"redis"`
}

// promFile is the part of prometheus.yml that names the Services it scrapes.
type promFile struct {
	ScrapeConfigs []struct {
		JobName      string `json:"job_name"`
		DNSSDConfigs []struct {
			Names []string `json:"names"`
			Type  string   `json:"type"`
			Port  int      `json:"port"`
		} `json:"dns_sd_configs"`
	} `json:"scrape_configs"`
}

// rendered is one overlay's output, by kind and name.
type rendered struct {
	region  string
	objects []object
	yaml    []byte
}

func (r *rendered) find(kind, name string) (object, bool) {
	for _, o := range r.objects {
		if o.Kind == kind && o.Metadata.Name == name {
			return o, true
		}
	}
	return object{}, false
}

func (r *rendered) ofKind(kind string) []object {
	var out []object
	for _, o := range r.objects {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// must finds kind/name and decodes it into v, or fails the test.
func (r *rendered) must(t *testing.T, kind, name string, v any) object {
	t.Helper()
	o, ok := r.find(kind, name)
	if !ok {
		t.Fatalf("%s: no %s %s among %s", r.region, kind, name, r.names())
	}
	if err := json.Unmarshal(o.raw, v); err != nil {
		t.Fatalf("%s %s: %v", kind, name, err)
	}
	return o
}

func (r *rendered) names() string {
	var s []string
	for _, o := range r.objects {
		s = append(s, o.Kind+"/"+o.Metadata.Name)
	}
	return strings.Join(s, ", ")
}

// overlays renders every ../regions/*/kustomization.yaml, by region (the folder name).
func overlays(t *testing.T) map[string]*rendered {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("..", "regions", "*", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*rendered{}
	for _, p := range paths {
		dir := filepath.Dir(p)
		region := filepath.Base(dir)
		m, err := Render(dir)
		if err != nil {
			t.Fatalf("region %s: %v", region, err)
		}
		r := &rendered{region: region}
		if r.yaml, err = m.AsYaml(); err != nil {
			t.Fatal(err)
		}
		for _, res := range m.Resources() {
			b, err := res.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			o := object{raw: b}
			if err := json.Unmarshal(b, &o); err != nil {
				t.Fatal(err)
			}
			r.objects = append(r.objects, o)
		}
		out[region] = r
	}
	for _, want := range wantRegions {
		if out[want] == nil {
			t.Errorf("no overlay ../regions/%s/kustomization.yaml", want)
		}
	}
	if out[homeRegion] == nil {
		t.Fatalf("the home region %s has no overlay", homeRegion)
	}
	return out
}

func TestOverlays(t *testing.T) {
	all := overlays(t)
	var regions []string
	for region := range all {
		regions = append(regions, region)
	}
	slices.Sort(regions)

	for _, region := range regions {
		r := all[region]
		t.Run(region, func(t *testing.T) {
			t.Run("labels and names", func(t *testing.T) { checkMetadata(t, r) })
			t.Run("no secret inlined", func(t *testing.T) { checkNoSecrets(t, r) })
			t.Run("database roles", func(t *testing.T) { checkDatabaseRoles(t, r) })
			t.Run("gateway", func(t *testing.T) { checkGateway(t, r) })
			t.Run("services", func(t *testing.T) { checkServices(t, r) })
			t.Run("pdb", func(t *testing.T) { checkPDB(t, r) })
			t.Run("servicemonitors", func(t *testing.T) { checkServiceMonitors(t, r) })
			t.Run("rebalancer", func(t *testing.T) { checkRebalancer(t, r, regions) })
			t.Run("prometheus.yml", func(t *testing.T) { checkPrometheusTargets(t, r) })
		})
	}
}

func checkMetadata(t *testing.T, r *rendered) {
	if len(r.objects) == 0 {
		t.Fatal("rendered nothing")
	}
	for _, o := range r.objects {
		id := o.Kind + "/" + o.Metadata.Name
		if got := o.Metadata.Labels[regionKey]; got != r.region {
			t.Errorf("%s: label %s=%q, want %q", id, regionKey, got, r.region)
		}
		if o.Metadata.Namespace != namespace {
			t.Errorf("%s: namespace %q, want %q", id, o.Metadata.Namespace, namespace)
		}
		if !strings.Contains(o.Metadata.Name, "-"+r.region) {
			t.Errorf("%s: name lacks the region suffix -%s", id, r.region)
		}
		// Secrets are created by the operator, never rendered from the repository.
		if o.Kind == "Secret" {
			t.Errorf("%s: a Secret is rendered; credentials must not be in the repository", id)
		}
	}
	if bytes.Contains(r.yaml, []byte("base-placeholder")) {
		t.Error("the base's placeholder gateway.yaml was not replaced by the region's")
	}
}

func checkNoSecrets(t *testing.T, r *rendered) {
	for _, o := range r.objects {
		lower := bytes.ToLower(o.raw)
		for _, m := range secretMarkers {
			if bytes.Contains(lower, []byte(m)) {
				t.Errorf("%s/%s contains %q: URLs with credentials come from Secrets", o.Kind, o.Metadata.Name, m)
			}
		}
	}
	// Every *_URL variable of every container comes from a Secret, never a literal.
	for _, o := range r.ofKind("Deployment") {
		var d deployment
		if err := json.Unmarshal(o.raw, &d); err != nil {
			t.Fatal(err)
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, e := range c.Env {
				if !strings.HasSuffix(e.Name, "_URL") {
					continue
				}
				if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
					t.Errorf("%s container %s: env %s is not a secretKeyRef", o.Metadata.Name, c.Name, e.Name)
				}
			}
		}
	}
}

// envSecret returns the Secret name and key behind env name, failing when it is anything
// but a secretKeyRef.
func envSecret(t *testing.T, c container, name string) (secret, key string) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name != name {
			continue
		}
		if e.Value != "" {
			t.Errorf("container %s: %s has a literal value", c.Name, name)
		}
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Fatalf("container %s: %s is not from a secretKeyRef", c.Name, name)
		}
		return e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key
	}
	t.Fatalf("container %s: no env %s", c.Name, name)
	return "", ""
}

func containerNamed(t *testing.T, d deployment, name string) container {
	t.Helper()
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return container{}
}

// portNumber resolves a probe's or Service's port (a name or a number) against c.
func portNumber(c container, port any) (int, bool) {
	switch p := port.(type) {
	case float64:
		return int(p), true
	case string:
		for _, cp := range c.Ports {
			if cp.Name == p {
				return cp.ContainerPort, true
			}
		}
		if n, err := strconv.Atoi(p); err == nil {
			return n, true
		}
	}
	return 0, false
}

func listenPort(t *testing.T, key, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("gateway.yaml %s %q: %v", key, addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("gateway.yaml %s %q: %v", key, addr, err)
	}
	return n
}

func checkProbe(t *testing.T, c container, what string, p *probe, path string, wantPort int) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("container %s: no HTTP %s probe", c.Name, what)
		return
	}
	if p.HTTPGet.Path != path {
		t.Errorf("container %s: %s probe path %q, want %q", c.Name, what, p.HTTPGet.Path, path)
	}
	if n, ok := portNumber(c, p.HTTPGet.Port); !ok || n != wantPort {
		t.Errorf("container %s: %s probe port %v is %d, want the admin port %d", c.Name, what, p.HTTPGet.Port, n, wantPort)
	}
}

func checkHardened(t *testing.T, name string, d deployment, c container) {
	t.Helper()
	psc := d.Spec.Template.Spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Errorf("%s: pod securityContext.runAsNonRoot is not true", name)
	}
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Errorf("%s: container %s has no securityContext", name, c.Name)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("%s: container %s: readOnlyRootFilesystem is not true", name, c.Name)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("%s: container %s: allowPrivilegeEscalation is not false", name, c.Name)
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
		t.Errorf("%s: container %s: runAsNonRoot is not true", name, c.Name)
	}
	for _, res := range []string{"cpu", "memory"} {
		if c.Resources.Requests[res] == "" {
			t.Errorf("%s: container %s: no %s request", name, c.Name, res)
		}
	}
	if c.Resources.Limits["memory"] == "" {
		t.Errorf("%s: container %s: no memory limit", name, c.Name)
	}
	for k, v := range d.Spec.Selector.MatchLabels {
		if d.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("%s: selector %s=%s does not match the pod template", name, k, v)
		}
	}
	if d.Spec.Selector.MatchLabels[regionKey] == "" {
		t.Errorf("%s: the selector lacks %s, so it could adopt another region's pods", name, regionKey)
	}
}

func checkGateway(t *testing.T, r *rendered) {
	name := "gateway-" + r.region
	var d deployment
	r.must(t, "Deployment", name, &d)
	c := containerNamed(t, d, "gateway")

	// The ConfigMap is the region's own gateway.yaml, mounted where --config points.
	want, err := os.ReadFile(filepath.Join("..", "regions", r.region, "gateway.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vol string
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil {
			vol = v.ConfigMap.Name
		}
	}
	if !strings.HasPrefix(vol, "gateway-config-"+r.region+"-") {
		t.Fatalf("config volume references ConfigMap %q, want the generated gateway-config-%s-HASH", vol, r.region)
	}
	var cm configMap
	r.must(t, "ConfigMap", vol, &cm)
	if cm.Data["gateway.yaml"] != string(want) {
		t.Errorf("ConfigMap %s: gateway.yaml is not ../regions/%s/gateway.yaml", vol, r.region)
	}
	var cfg gatewayFile
	if err := yaml.Unmarshal([]byte(cm.Data["gateway.yaml"]), &cfg); err != nil {
		t.Fatalf("ConfigMap %s gateway.yaml: %v", vol, err)
	}
	if cfg.Region != r.region {
		t.Errorf("gateway.yaml region %q, want %q", cfg.Region, r.region)
	}
	if cfg.DatabaseURL != "" || cfg.Redis.URL != "" {
		t.Error("gateway.yaml sets database_url or redis.url: they must come from the Secrets")
	}
	if !slices.Contains(c.Args, "--config=/etc/quotaplane/gateway.yaml") {
		t.Errorf("args %q: want --config=/etc/quotaplane/gateway.yaml", c.Args)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		mounted = mounted || m.MountPath == "/etc/quotaplane"
	}
	if !mounted {
		t.Error("the ConfigMap is not mounted at /etc/quotaplane")
	}

	// URLs from this region's Secrets.
	if s, k := envSecret(t, c, "RATELIMIT_REDIS_URL"); s != fmt.Sprintf(redisSecretFmt, r.region) || k != "url" {
		t.Errorf("RATELIMIT_REDIS_URL from secret %s key %s, want %s key url", s, k, fmt.Sprintf(redisSecretFmt, r.region))
	}
	if s, k := envSecret(t, c, "RATELIMIT_DATABASE_URL"); s != databaseRoles["gateway"].secret || k != "url" {
		t.Errorf("RATELIMIT_DATABASE_URL from secret %s key %s, want the gateways' own %s key url", s, k, databaseRoles["gateway"].secret)
	}

	// Probes and ports agree with the listeners in gateway.yaml.
	admin := listenPort(t, "admin_listen", cfg.AdminListen)
	checkProbe(t, c, "liveness", c.LivenessProbe, "/healthz", admin)
	checkProbe(t, c, "readiness", c.ReadinessProbe, "/readyz", admin)
	if n, ok := portNumber(c, "http"); !ok || n != listenPort(t, "listen", cfg.Listen) {
		t.Errorf("container port http %d does not match listen %s", n, cfg.Listen)
	}

	// The fallback divides by expected_instances until heartbeats load: the planned count,
	// which the HPA keeps (checkHPA) or, without one, replicas.
	if len(r.ofKind("HorizontalPodAutoscaler")) == 0 {
		if d.Spec.Replicas == nil || *d.Spec.Replicas != cfg.ExpectedInstances {
			t.Errorf("no HPA and replicas %v, want expected_instances %d from gateway.yaml", d.Spec.Replicas, cfg.ExpectedInstances)
		}
	}
	// The pod gets preStop + drain_timeout before SIGKILL.
	drain, err := time.ParseDuration(cfg.DrainTimeout)
	if err != nil {
		t.Fatalf("gateway.yaml drain_timeout %q: %v", cfg.DrainTimeout, err)
	}
	need := drain
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		need += time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= need {
		t.Errorf("terminationGracePeriodSeconds does not exceed preStop + drain_timeout = %s", need)
	}
	checkHardened(t, name, d, c)
}

func checkServices(t *testing.T, r *rendered) {
	var d deployment
	r.must(t, "Deployment", "gateway-"+r.region, &d)
	pods := d.Spec.Template.Metadata.Labels
	for _, o := range r.ofKind("Service") {
		var s service
		if err := json.Unmarshal(o.raw, &s); err != nil {
			t.Fatal(err)
		}
		if s.Spec.Selector[regionKey] != r.region {
			t.Errorf("Service %s: selector lacks %s=%s, so it could reach another region's pods", o.Metadata.Name, regionKey, r.region)
		}
	}
	for _, name := range []string{"gateway-" + r.region, "gateway-metrics-" + r.region} {
		var s service
		r.must(t, "Service", name, &s)
		for k, v := range s.Spec.Selector {
			if pods[k] != v {
				t.Errorf("Service %s: selector %s=%s matches no gateway pod", name, k, v)
			}
		}
	}
}

func checkPDB(t *testing.T, r *rendered) {
	var d deployment
	r.must(t, "Deployment", "gateway-"+r.region, &d)
	var p pdb
	r.must(t, "PodDisruptionBudget", "gateway-"+r.region, &p)
	if p.Spec.MinAvailable == nil && p.Spec.MaxUnavailable == nil {
		t.Error("PodDisruptionBudget sets neither minAvailable nor maxUnavailable")
	}
	if len(p.Spec.Selector.MatchLabels) == 0 || p.Spec.Selector.MatchLabels[regionKey] != r.region {
		t.Errorf("PodDisruptionBudget selector %v: want the gateway pods of %s", p.Spec.Selector.MatchLabels, r.region)
	}
	for k, v := range p.Spec.Selector.MatchLabels {
		if d.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("PodDisruptionBudget selector %s=%s matches no gateway pod", k, v)
		}
	}
}

func checkServiceMonitors(t *testing.T, r *rendered) {
	want := []string{"gateway"}
	if r.region == homeRegion {
		want = append(want, "rebalancer")
	}
	monitors := r.ofKind("ServiceMonitor")
	if len(monitors) != len(want) {
		t.Errorf("%d ServiceMonitors, want %d (%v)", len(monitors), len(want), want)
	}
	for _, job := range want {
		var sm serviceMonitor
		o := r.must(t, "ServiceMonitor", job+"-"+r.region, &sm)
		if o.APIVersion != "monitoring.coreos.com/v1" {
			t.Errorf("ServiceMonitor %s: apiVersion %s", o.Metadata.Name, o.APIVersion)
		}
		checkSelectable(t, o)
		if sm.Spec.Selector.MatchLabels[regionKey] != r.region {
			t.Errorf("ServiceMonitor %s: selector %v lacks %s=%s", o.Metadata.Name, sm.Spec.Selector.MatchLabels, regionKey, r.region)
		}
		// It must select exactly one Service (else the pods are scraped twice), which has
		// the endpoint's port and gives the job name the alert rules expect.
		var selected []object
		for _, so := range r.ofKind("Service") {
			match := len(sm.Spec.Selector.MatchLabels) > 0
			for k, v := range sm.Spec.Selector.MatchLabels {
				match = match && so.Metadata.Labels[k] == v
			}
			if match {
				selected = append(selected, so)
			}
		}
		if len(selected) != 1 {
			t.Errorf("ServiceMonitor %s selects %d Services, want 1", o.Metadata.Name, len(selected))
			continue
		}
		if got := selected[0].Metadata.Labels[sm.Spec.JobLabel]; got != job {
			t.Errorf("ServiceMonitor %s: job label %q from %s, want %q", o.Metadata.Name, got, sm.Spec.JobLabel, job)
		}
		var s service
		if err := json.Unmarshal(selected[0].raw, &s); err != nil {
			t.Fatal(err)
		}
		if len(sm.Spec.Endpoints) == 0 {
			t.Fatalf("ServiceMonitor %s has no endpoints", o.Metadata.Name)
		}
		for _, ep := range sm.Spec.Endpoints {
			if !slices.ContainsFunc(s.Spec.Ports, func(p servicePort) bool {
				return p.Name == ep.Port
			}) {
				t.Errorf("ServiceMonitor %s: port %q is not a port of Service %s", o.Metadata.Name, ep.Port, selected[0].Metadata.Name)
			}
			if ep.Path != "/metrics" || !ep.HonorLabels {
				t.Errorf("ServiceMonitor %s: path %q honorLabels %v, want /metrics and true", o.Metadata.Name, ep.Path, ep.HonorLabels)
			}
		}
	}
}

func checkRebalancer(t *testing.T, r *rendered, regions []string) {
	o, found := r.find("Deployment", "rebalancer-"+r.region)
	if r.region != homeRegion {
		if found {
			t.Errorf("a rebalancer Deployment in %s; only the home region %s runs one", r.region, homeRegion)
		}
		for _, d := range r.ofKind("Deployment") {
			if strings.HasPrefix(d.Metadata.Name, "rebalancer") {
				t.Errorf("Deployment %s in %s; only the home region runs the rebalancer", d.Metadata.Name, r.region)
			}
		}
		return
	}
	if !found {
		t.Fatalf("no rebalancer Deployment in the home region %s", r.region)
	}
	var d deployment
	if err := json.Unmarshal(o.raw, &d); err != nil {
		t.Fatal(err)
	}
	c := containerNamed(t, d, "rebalancer")
	if s, k := envSecret(t, c, "RATELIMIT_DATABASE_URL"); s != databaseRoles["rebalancer"].secret || k != "url" {
		t.Errorf("RATELIMIT_DATABASE_URL from secret %s key %s, want the rebalancer's own %s key url", s, k, databaseRoles["rebalancer"].secret)
	}
	admin := -1
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--database-url") {
			t.Errorf("arg %q: the database URL comes from RATELIMIT_DATABASE_URL", a)
		}
		if v, ok := strings.CutPrefix(a, "--admin-listen="); ok {
			admin = listenPort(t, "--admin-listen", v)
		}
	}
	// One Prometheus per region, each region exactly once.
	for _, region := range regions {
		n := 0
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--prometheus-url="+region+"=http") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("args %q: %d --prometheus-url=%s=URL, want 1", c.Args, n, region)
		}
	}
	if n, ok := portNumber(c, "admin"); !ok || n != admin {
		t.Errorf("container port admin %d does not match --admin-listen (%d)", n, admin)
	}
	checkProbe(t, c, "liveness", c.LivenessProbe, "/healthz", admin)
	checkHardened(t, o.Metadata.Name, d, c)
}

// checkPrometheusTargets: every DNS name the region's prometheus.yml scrapes is a headless
// Service the overlay renders, in its namespace, with the scraped port.
func checkPrometheusTargets(t *testing.T, r *rendered) {
	data, err := os.ReadFile(filepath.Join("..", "regions", r.region, "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var p promFile
	if err := yaml.Unmarshal(data, &p); err != nil {
		t.Fatal(err)
	}
	jobs := map[string]bool{}
	for _, sc := range p.ScrapeConfigs {
		jobs[sc.JobName] = true
		if len(sc.DNSSDConfigs) == 0 {
			t.Errorf("job %s: no dns_sd_configs", sc.JobName)
		}
		for _, sd := range sc.DNSSDConfigs {
			for _, name := range sd.Names {
				svc, ns, ok := strings.Cut(strings.TrimSuffix(name, ".svc.cluster.local"), ".")
				if !ok || !strings.HasSuffix(name, ".svc.cluster.local") {
					t.Errorf("job %s: %q is not SERVICE.NAMESPACE.svc.cluster.local", sc.JobName, name)
					continue
				}
				var s service
				o := r.must(t, "Service", svc, &s)
				if o.Metadata.Namespace != ns {
					t.Errorf("job %s: Service %s is in namespace %s, not %s", sc.JobName, svc, o.Metadata.Namespace, ns)
				}
				if s.Spec.ClusterIP != "None" {
					t.Errorf("job %s: Service %s is not headless, so DNS returns one virtual IP, not the pods", sc.JobName, svc)
				}
				if !slices.ContainsFunc(s.Spec.Ports, func(p servicePort) bool {
					return p.Port == sd.Port
				}) {
					t.Errorf("job %s: Service %s has no port %d", sc.JobName, svc, sd.Port)
				}
			}
		}
	}
	if jobs["rebalancer"] != (r.region == homeRegion) {
		t.Errorf("prometheus.yml job rebalancer present = %v; want it in the home region only", jobs["rebalancer"])
	}
}
