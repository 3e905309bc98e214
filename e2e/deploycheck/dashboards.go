package deploycheck

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// DeployDir is the deploy/ folder of the source tree this package was built from.
func DeployDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "deploy")
}

// DashboardFile is the Grafana dashboard, ready to import or provision.
func DashboardFile() string { return filepath.Join(DeployDir(), "dashboards", "quotaplane.json") }

// Query is one panel target's PromQL with the template variables substituted.
type Query struct {
	Panel string // the panel's title
	Expr  string
}

// Queries returns every target of every panel of the dashboard, in panel order, with the
// template variables set as Grafana would for every region over the last hour:
// $region -> .* (the dashboard only uses it as region=~"$region"), $__rate_interval -> 1m,
// $__interval -> 15s, $__range -> 5m. A variable it does not know is an error.
func Queries() ([]Query, error) {
	data, err := os.ReadFile(DashboardFile())
	if err != nil {
		return nil, fmt.Errorf("read the dashboard: %w", err)
	}
	return queries(data)
}

// substitutions are the values Queries gives the template variables.
var substitutions = strings.NewReplacer(
	"${region}", ".*",
	"$region", ".*",
	"${__rate_interval}", "1m",
	"$__rate_interval", "1m",
	"${__interval}", "15s",
	"$__interval", "15s",
	"${__range}", "5m",
	"$__range", "5m",
)

// dashboard is the part of the dashboard JSON that Queries and the tests read.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

// panel is one panel; a row may hold nested panels.
type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	GridPos    struct {
		X int `json:"x"`
		Y int `json:"y"`
		W int `json:"w"`
		H int `json:"h"`
	} `json:"gridPos"`
	Targets []target `json:"targets"`
	Panels  []panel  `json:"panels"`
}

type target struct {
	RefID      string      `json:"refId"`
	Expr       string      `json:"expr"`
	Datasource *datasource `json:"datasource"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name       string      `json:"name"`
	Type       string      `json:"type"`
	Query      any         `json:"query"` // a string, or {"query": ...} for a Prometheus query variable
	Definition string      `json:"definition"`
	Datasource *datasource `json:"datasource"`
	IncludeAll bool        `json:"includeAll"`
	AllValue   string      `json:"allValue"`
	Multi      bool        `json:"multi"`
}

func parse(data []byte) (dashboard, error) {
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		return dashboard{}, fmt.Errorf("parse dashboard: %w", err)
	}
	return d, nil
}

// allPanels returns the panels in order, a row's nested panels after the row.
func (d dashboard) allPanels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// substitute fills in the template variables of one expression as Queries does.
func substitute(expr string) (string, error) {
	out := substitutions.Replace(expr)
	if i := strings.IndexByte(out, '$'); i >= 0 {
		end := i + 1
		for end < len(out) && strings.IndexByte("_{}abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", out[end]) >= 0 {
			end++
		}
		return "", fmt.Errorf("unknown template variable %s in %q", out[i:end], expr)
	}
	return out, nil
}

func queries(data []byte) ([]Query, error) {
	d, err := parse(data)
	if err != nil {
		return nil, err
	}
	var out []Query
	for _, p := range d.allPanels() {
		for _, t := range p.Targets {
			if strings.TrimSpace(t.Expr) == "" {
				return nil, fmt.Errorf("panel %q target %s: no expr", p.Title, t.RefID)
			}
			e, err := substitute(t.Expr)
			if err != nil {
				return nil, fmt.Errorf("panel %q target %s: %w", p.Title, t.RefID, err)
			}
			out = append(out, Query{Panel: p.Title, Expr: e})
		}
	}
	return out, nil
}
