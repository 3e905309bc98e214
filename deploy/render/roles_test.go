package render

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// databaseSecretPrefix starts the name of every Secret that holds a database URL.
const databaseSecretPrefix = "quotaplane-database"

// databaseRole is what one kind of workload connects to PostgreSQL as (docs/SECURITY.md,
// "Database roles"): the Secret its RATELIMIT_DATABASE_URL comes from and, but for the
// owner, the login role deploy/compose/roles.sql creates and the group it joins.
type databaseRole struct {
	secret, login, group string
}

// databaseRoles maps a workload's role (workloadRole) to its credentials. Only migrate
// gets the owner's Secret; a ratectl Job that is not the migration (a CI `ratectl apply`,
// say) is an operator.
var databaseRoles = map[string]databaseRole{
	"migrate":    {secret: "quotaplane-database-owner"},
	"gateway":    {"quotaplane-database-gateway", "quotaplane_gateway_login", "quotaplane_gateway"},
	"rebalancer": {"quotaplane-database-rebalancer", "quotaplane_rebalancer_login", "quotaplane_rebalancer"},
	"ratectl":    {"quotaplane-database-ratectl", "quotaplane_ratectl_login", "quotaplane_operator"},
}

// workloadRole names the database role of a Deployment, Job or CronJob from its labels:
// app.kubernetes.io/component, except that every ratectl workload but the migration is
// "ratectl".
func workloadRole(o object) string {
	c := o.Metadata.Labels["app.kubernetes.io/component"]
	if o.Metadata.Labels["app.kubernetes.io/name"] == "ratectl" && c != "migrate" {
		return "ratectl"
	}
	return c
}

// workloadContainers returns the containers of a Deployment, Job or CronJob (ok false for
// any other kind).
func workloadContainers(o object) ([]container, bool, error) {
	var w struct {
		Spec struct {
			Template struct {
				Spec struct {
					InitContainers []container `json:"initContainers"`
					Containers     []container `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
			JobTemplate struct {
				Spec struct {
					Template struct {
						Spec struct {
							InitContainers []container `json:"initContainers"`
							Containers     []container `json:"containers"`
						} `json:"spec"`
					} `json:"template"`
				} `json:"spec"`
			} `json:"jobTemplate"`
		} `json:"spec"`
	}
	switch o.Kind {
	case "Deployment", "Job", "CronJob", "StatefulSet", "DaemonSet":
	default:
		return nil, false, nil
	}
	if err := json.Unmarshal(o.raw, &w); err != nil {
		return nil, true, fmt.Errorf("%s %s: %w", o.Kind, o.Metadata.Name, err)
	}
	pod := w.Spec.Template.Spec
	if o.Kind == "CronJob" {
		pod = w.Spec.JobTemplate.Spec.Template.Spec
	}
	return append(pod.InitContainers, pod.Containers...), true, nil
}

// databaseRoleProblems lists every way a workload reaches a database Secret that is not
// its role's: a database URL from another role's Secret (the owner's above all), a
// workload with a database URL and no known role, or a database Secret read whole with
// envFrom. An empty list means each workload reads its own Secret and only the migration
// reads the owner's.
func databaseRoleProblems(objects []object) []string {
	var out []string
	for _, o := range objects {
		cs, ok, err := workloadContainers(o)
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		if !ok {
			continue
		}
		role, known := databaseRoles[workloadRole(o)]
		for _, c := range cs {
			id := fmt.Sprintf("%s %s container %s", o.Kind, o.Metadata.Name, c.Name)
			for _, ef := range c.EnvFrom {
				if ef.SecretRef != nil && strings.HasPrefix(ef.SecretRef.Name, databaseSecretPrefix) {
					out = append(out, fmt.Sprintf("%s: envFrom Secret %s; read only key url, as RATELIMIT_DATABASE_URL", id, ef.SecretRef.Name))
				}
			}
			for _, e := range c.Env {
				var ref string
				var key string
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					ref, key = e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key
				}
				if e.Name != "RATELIMIT_DATABASE_URL" && !strings.HasPrefix(ref, databaseSecretPrefix) {
					continue
				}
				switch {
				case !known:
					out = append(out, fmt.Sprintf("%s: %s from Secret %q, but role %q (app.kubernetes.io/component) has no database Secret", id, e.Name, ref, workloadRole(o)))
				case ref != role.secret || key != "url":
					out = append(out, fmt.Sprintf("%s: %s from Secret %q key %q, want its role's %s key url", id, e.Name, ref, key, role.secret))
				}
			}
		}
	}
	return out
}

func checkDatabaseRoles(t *testing.T, r *rendered) {
	for _, p := range databaseRoleProblems(r.objects) {
		t.Error(p)
	}
}

// TestDatabaseRoleProblems: the check fails on what it is meant to catch, in a copy of
// the home region's render.
func TestDatabaseRoleProblems(t *testing.T) {
	home := overlays(t)[homeRegion]
	owner := databaseRoles["migrate"].secret
	// swap returns the home render with old replaced by new in the one object kind/name.
	swap := func(kind, name, old, new string) []object {
		t.Helper()
		objs := slices.Clone(home.objects)
		for i, o := range objs {
			if o.Kind == kind && o.Metadata.Name == name {
				if !strings.Contains(string(o.raw), old) {
					t.Fatalf("%s %s has no %q", kind, name, old)
				}
				objs[i] = object{raw: []byte(strings.ReplaceAll(string(o.raw), old, new))}
				if err := json.Unmarshal(objs[i].raw, &objs[i]); err != nil {
					t.Fatal(err)
				}
				return objs
			}
		}
		t.Fatalf("no %s %s", kind, name)
		return nil
	}
	ratectlJob := func(secret string) object {
		raw := fmt.Sprintf(`{"apiVersion":"batch/v1","kind":"CronJob","metadata":{"name":"apply","labels":{"app.kubernetes.io/name":"ratectl"}},
"spec":{"jobTemplate":{"spec":{"template":{"spec":{"containers":[{"name":"ratectl","env":[
{"name":"RATELIMIT_DATABASE_URL","valueFrom":{"secretKeyRef":{"name":%q,"key":"url"}}}]}]}}}}}}`, secret)
		o := object{raw: []byte(raw)}
		if err := json.Unmarshal(o.raw, &o); err != nil {
			t.Fatal(err)
		}
		return o
	}

	if p := databaseRoleProblems(home.objects); len(p) != 0 {
		t.Fatalf("the shipped render has problems: %q", p)
	}
	cases := []struct {
		name    string
		objects []object
		want    string // in the one problem reported; "" for none
	}{
		{"gateway on the owner's", swap("Deployment", "gateway-"+homeRegion, databaseRoles["gateway"].secret, owner), "want its role's quotaplane-database-gateway"},
		{"rebalancer on the gateway's", swap("Deployment", "rebalancer-"+homeRegion, databaseRoles["rebalancer"].secret, databaseRoles["gateway"].secret), "want its role's quotaplane-database-rebalancer"},
		{"gateway on the old shared Secret", swap("Deployment", "gateway-"+homeRegion, databaseRoles["gateway"].secret, databaseSecretPrefix), `Secret "quotaplane-database" key "url"`},
		{"migrate on the gateway's", swap("Job", "migrate-"+homeRegion, owner, databaseRoles["gateway"].secret), "want its role's " + owner},
		{"a key other than url", swap("Job", "migrate-"+homeRegion, `"key":"url"`, `"key":"password"`), `key "password"`},
		{"unknown role", swap("Deployment", "rebalancer-"+homeRegion, `"app.kubernetes.io/component":"rebalancer"`, `"app.kubernetes.io/component":"sidecar"`), `role "sidecar"`},
		{"ratectl job on the owner's", append(slices.Clone(home.objects), ratectlJob(owner)), "want its role's quotaplane-database-ratectl"},
		{"ratectl job on the operator's", append(slices.Clone(home.objects), ratectlJob(databaseRoles["ratectl"].secret)), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := databaseRoleProblems(tc.objects)
			if tc.want == "" {
				if len(p) != 0 {
					t.Errorf("problems %q, want none", p)
				}
				return
			}
			if len(p) != 1 || !strings.Contains(p[0], tc.want) {
				t.Errorf("problems %q, want one containing %q", p, tc.want)
			}
		})
	}
}

// TestSecretGenerators: deploy/secrets/REGION generates exactly the Secrets that region's
// overlay reads, each with the one key url holding the line written to its file, and names
// the login role of deploy/compose/roles.sql behind each database Secret.
func TestSecretGenerators(t *testing.T) {
	ignore, err := os.ReadFile(filepath.Join("..", "secrets", ".gitignore"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Fields(string(ignore)), "*.env") {
		t.Error("deploy/secrets/.gitignore does not ignore *.env: the URL files could be committed")
	}
	rolesSQL, err := os.ReadFile(filepath.Join("..", "compose", "roles.sql"))
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range databaseRoles {
		if role.login != "" && !strings.Contains(string(rolesSQL), fmt.Sprintf("('%s', '%s'", role.login, role.group)) {
			t.Errorf("deploy/compose/roles.sql does not make %s a member of %s", role.login, role.group)
		}
	}

	for region, r := range overlays(t) {
		t.Run(region, func(t *testing.T) {
			dir := filepath.Join("..", "secrets", region)
			k, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
			if err != nil {
				t.Fatalf("no Secret generator for region %s: %v", region, err)
			}
			var kz struct {
				SecretGenerator []struct {
					Name string   `json:"name"`
					Envs []string `json:"envs"`
				} `json:"secretGenerator"`
			}
			if err := yaml.Unmarshal(k, &kz); err != nil {
				t.Fatal(err)
			}
			// Render it with a URL in every file it reads; a query with '=' in it checks
			// that only the first '=' of the line splits key from value.
			fs := filesys.MakeFsInMemory()
			if err := fs.WriteFile("/kustomization.yaml", k); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{}
			for _, g := range kz.SecretGenerator {
				url := fmt.Sprintf("postgres://%s:pw@db.internal:5432/quotaplane?sslmode=verify-full", g.Name)
				want[g.Name] = url
				for _, f := range g.Envs {
					if err := fs.WriteFile("/"+f, []byte("url="+url+"\n")); err != nil {
						t.Fatal(err)
					}
				}
			}
			m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, "/")
			if err != nil {
				t.Fatalf("kustomize build deploy/secrets/%s: %v", region, err)
			}
			var generated []string
			for _, res := range m.Resources() {
				if res.GetKind() != "Secret" {
					t.Errorf("%s %s: the generator renders Secrets only", res.GetKind(), res.GetName())
					continue
				}
				if res.GetNamespace() != namespace {
					t.Errorf("Secret %s in namespace %q, want %s", res.GetName(), res.GetNamespace(), namespace)
				}
				data := res.GetDataMap()
				if len(data) != 1 {
					t.Errorf("Secret %s has keys %v, want url only", res.GetName(), data)
				}
				got, err := base64.StdEncoding.DecodeString(data["url"])
				if err != nil || string(got) != want[res.GetName()] {
					t.Errorf("Secret %s url = %q (%v), want the file's %q", res.GetName(), got, err, want[res.GetName()])
				}
				generated = append(generated, res.GetName())
			}

			// Exactly the Secrets the overlay's workloads read: none missing, none extra
			// (an owner's URL where nothing migrates is a credential nobody needs).
			var read []string
			for _, o := range r.objects {
				cs, ok, err := workloadContainers(o)
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range cs {
					for _, e := range c.Env {
						if ok && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && !slices.Contains(read, e.ValueFrom.SecretKeyRef.Name) {
							read = append(read, e.ValueFrom.SecretKeyRef.Name)
						}
					}
				}
			}
			slices.Sort(generated)
			slices.Sort(read)
			if !slices.Equal(generated, read) {
				t.Errorf("deploy/secrets/%s generates %q; the overlay reads %q", region, generated, read)
			}
			for _, role := range databaseRoles {
				if role.login != "" && slices.Contains(generated, role.secret) && !strings.Contains(string(k), role.login) {
					t.Errorf("deploy/secrets/%s/kustomization.yaml does not say %s holds the URL of %s", region, role.secret, role.login)
				}
			}
		})
	}
}

// TestSecretsDocumented: the walk-through (docs/operations.md) and deploy/base/README.md
// name every Secret an overlay reads, and the walk-through no longer creates the one
// shared Secret quotaplane-database that every workload used to read.
func TestSecretsDocumented(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "base", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	ops, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for region, r := range overlays(t) {
		for _, o := range r.objects {
			cs, _, err := workloadContainers(o)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				for _, e := range c.Env {
					if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
						continue
					}
					name := strings.ReplaceAll(e.ValueFrom.SecretKeyRef.Name, region, "REGION")
					for doc, text := range map[string][]byte{"deploy/base/README.md": readme, "docs/operations.md": ops} {
						if !strings.Contains(string(text), "`"+name+"`") {
							t.Errorf("%s does not name the Secret %s (%s reads it)", doc, name, o.Metadata.Name)
						}
					}
				}
			}
		}
	}
	if re := regexp.MustCompile("quotaplane-database([^-a-z]|$)"); re.Match(ops) {
		t.Errorf("docs/operations.md names the retired shared Secret: %q", re.Find(ops))
	}
}
