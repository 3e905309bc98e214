package render

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"sigs.k8s.io/kustomize/api/provider"
	"sigs.k8s.io/kustomize/kustomize/v5/commands/edit"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The documents that tell a team how to point the overlays at their registry.
var retargetDocs = []string{filepath.Join("..", "..", "docs", "operations.md"), filepath.Join("..", "base", "README.md")}

// imageOf is the image each container runs, by container name: what `make image` builds.
var imageOf = map[string]string{"gateway": "gateway", "rebalancer": "rebalancer", "migrate": "ratectl"}

// TestRetargetImages runs each document's `kustomize edit set image` command, with the
// kustomize CLI's own code, in every overlay of a copy of deploy/ (REGISTRY and TAG set as
// a team would), renders the overlays and checks that every container of every object runs
// the team's image, and nothing still names the default registry.
func TestRetargetImages(t *testing.T) {
	const registry, tag = "registry.example.com/platform", "2.0.0-rc.1"
	env := map[string]string{"REGISTRY": registry, "TAG": tag}
	for _, doc := range retargetDocs {
		t.Run(filepath.Base(doc), func(t *testing.T) {
			cmds := editCommands(t, doc)
			if len(cmds) == 0 {
				t.Fatalf("%s has no `kustomize edit set image` command", doc)
			}
			tree := copyDeploy(t)
			for _, region := range overlayRegions(t, tree) {
				for _, c := range cmds {
					args := strings.Fields(os.Expand(c, func(k string) string { return env[k] }))
					kustomizeEdit(t, filepath.Join(tree, "regions", region), args)
				}
				m, err := Render(filepath.Join(tree, "regions", region))
				if err != nil {
					t.Fatal(err)
				}
				seen := 0
				for _, res := range m.Resources() {
					b, err := res.MarshalJSON()
					if err != nil {
						t.Fatal(err)
					}
					for name, image := range podImages(t, b) {
						seen++
						c := strings.TrimSuffix(name, " (init)")
						if want := registry + "/" + imageOf[c] + ":" + tag; image != want {
							t.Errorf("%s: %s %s: container %s runs %s, want %s", region, res.GetKind(), res.GetName(), name, image, want)
						}
					}
				}
				if seen == 0 {
					t.Errorf("%s: rendered no containers", region)
				}
			}
		})
	}
}

// editCommands are the `kustomize edit set image ...` commands of doc's code blocks, from
// "edit" on, up to a closing parenthesis or the end of the line, variables unexpanded.
func editCommands(t *testing.T, doc string) []string {
	t.Helper()
	data, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`kustomize (edit set image [^)\n;&|]*)`)
	var out []string
	for _, m := range re.FindAllStringSubmatch(codeBlocks(string(data)), -1) {
		out = append(out, strings.TrimSpace(m[1]))
	}
	return out
}

// codeBlocks is the text of doc's fenced code blocks.
func codeBlocks(doc string) string {
	var b strings.Builder
	in := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			in = !in
			continue
		}
		if in {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// kustomizeEdit runs `kustomize edit ARGS...` (args[0] == "edit") in dir, as the CLI does.
func kustomizeEdit(t *testing.T, dir string, args []string) {
	t.Helper()
	if len(args) == 0 || args[0] != "edit" {
		t.Fatalf("not a kustomize edit command: %q", args)
	}
	t.Chdir(dir) // the CLI edits ./kustomization.yaml
	pvd := provider.NewDefaultDepProvider()
	root := &cobra.Command{Use: "kustomize", SilenceUsage: true}
	root.AddCommand(edit.NewCmdEdit(filesys.MakeFsOnDisk(), pvd.GetFieldValidator(), pvd.GetResourceFactory(), io.Discard))
	root.SetArgs(args)
	root.SetOut(io.Discard)
	if err := root.Execute(); err != nil {
		t.Fatalf("kustomize %s in %s: %v", strings.Join(args, " "), dir, err)
	}
}

// copyDeploy copies what the overlays build from (deploy/base, components, regions) to a
// temporary deploy/ and returns its path.
func copyDeploy(t *testing.T) string {
	t.Helper()
	tree := filepath.Join(t.TempDir(), "deploy")
	for _, sub := range []string{"base", "components", "regions"} {
		if err := os.CopyFS(filepath.Join(tree, sub), os.DirFS(filepath.Join("..", sub))); err != nil {
			t.Fatal(err)
		}
	}
	return tree
}

func overlayRegions(t *testing.T, tree string) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(tree, "regions", "*", "kustomization.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no overlays in %s: %v", tree, err)
	}
	var out []string
	for _, p := range paths {
		out = append(out, filepath.Base(filepath.Dir(p)))
	}
	slices.Sort(out)
	return out
}

// podImages maps each container of an object's pod template (Deployment, Job, ...: any
// spec.template.spec, or a CronJob's spec.jobTemplate.spec.template.spec) to its image;
// init containers are named "NAME (init)".
func podImages(t *testing.T, raw []byte) map[string]string {
	t.Helper()
	type podSpec struct {
		Containers     []container `json:"containers"`
		InitContainers []container `json:"initContainers"`
	}
	var o struct {
		Spec struct {
			Template struct {
				Spec podSpec `json:"spec"`
			} `json:"template"`
			JobTemplate struct {
				Spec struct {
					Template struct {
						Spec podSpec `json:"spec"`
					} `json:"template"`
				} `json:"spec"`
			} `json:"jobTemplate"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, ps := range []podSpec{o.Spec.Template.Spec, o.Spec.JobTemplate.Spec.Template.Spec} {
		for _, c := range ps.Containers {
			out[c.Name] = c.Image
		}
		for _, c := range ps.InitContainers {
			out[c.Name+" (init)"] = c.Image
		}
	}
	return out
}

// releasePatch is the overlay patch docs/operations.md gives for a kube-prometheus-stack
// whose Helm release is not named kube-prometheus-stack (here: prometheus).
const releasePatch = `  - target:
      group: monitoring.coreos.com
    patch: |-
      - op: replace
        path: /metadata/labels/release
        value: prometheus
`

// TestReleaseLabelPatch: the documented patch, added to an overlay's patches, relabels
// every Prometheus Operator object, so a Prometheus selecting another release finds them.
func TestReleaseLabelPatch(t *testing.T) {
	doc, err := os.ReadFile(retargetDocs[0])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(codeBlocks(string(doc)), releasePatch) {
		t.Fatalf("docs/operations.md no longer shows this patch in a code block:\n%s", releasePatch)
	}
	var entry []any
	if err := yaml.Unmarshal([]byte(releasePatch), &entry); err != nil {
		t.Fatal(err)
	}
	tree := copyDeploy(t)
	for _, region := range overlayRegions(t, tree) {
		path := filepath.Join(tree, "regions", region, "kustomization.yaml")
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var k map[string]any
		if err := yaml.Unmarshal(data, &k); err != nil {
			t.Fatal(err)
		}
		patches, _ := k["patches"].([]any)
		k["patches"] = append(patches, entry...)
		if data, err = yaml.Marshal(k); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := Render(filepath.Join(tree, "regions", region))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, res := range m.Resources() {
			if !strings.HasPrefix(res.GetApiVersion(), "monitoring.coreos.com/") {
				continue
			}
			n++
			if got := res.GetLabels()["release"]; got != "prometheus" {
				t.Errorf("%s: %s %s: release=%q after the patch, want prometheus", region, res.GetKind(), res.GetName(), got)
			}
		}
		if n == 0 {
			t.Errorf("%s: no monitoring.coreos.com objects rendered", region)
		}
	}
}
