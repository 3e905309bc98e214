package store

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"

	"github.com/quotaplane/quotaplane/regions"
)

// MaxLimitsSize bounds a limits file, in bytes: a control plane's configuration, not a
// data set. A reader need read no more than one byte past it (ParseLimits refuses that).
const MaxLimitsSize = 16 << 20

// ParseLimits reads a limits file (the document ratectl apply -f takes; JSON is YAML too)
// strictly, and stops when ctx ends, with an error wrapping context.Cause(ctx): at most
// MaxLimitsSize bytes, one YAML document, the node and depth budgets with aliases
// expanded, ids and text as YAML strings whatever they look like, whole numbers where a
// count belongs, no unknown fields (errors name the line and the field); then the
// sections as a Config, normalized (Normalize: its errors are joined, one per line).
func ParseLimits(ctx context.Context, data []byte) (Config, error) {
	if len(data) > MaxLimitsSize {
		return Config{}, fmt.Errorf("larger than %d bytes", MaxLimitsSize)
	}
	f, err := decodeLimits(ctx, data)
	if err != nil {
		return Config{}, err
	}
	c, err := f.config()
	if err != nil {
		return Config{}, err
	}
	if err := c.Normalize(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// MarshalLimits is c as a limits file (YAML) that ParseLimits reads back as c: the
// sections c holds (a nil one left out), lists indented.
func MarshalLimits(c Config) ([]byte, error) {
	b, err := yaml.MarshalWithOptions(toLimitsFile(c), yaml.IndentSequence(true))
	if err != nil {
		return nil, fmt.Errorf("marshal limits: %w", err)
	}
	return quoteNonFinite(b)
}

// quoteNonFinite quotes every scalar of b that YAML reads as infinity or NaN. The
// encoder quotes an id that looks like a number (0042, 1.10) but not one spelled .inf,
// -.inf or .nan, valid ids that ParseLimits would then refuse as numbers, and no field of
// the file holds a non-finite number. The nodes' lines and columns say where.
func quoteNonFinite(b []byte) ([]byte, error) {
	f, err := parser.ParseBytes(b, 0)
	if err != nil {
		return nil, fmt.Errorf("marshal limits: read back: %w", err)
	}
	var at nonFinite
	for _, d := range f.Docs {
		ast.Walk(&at, d)
	}
	if len(at) == 0 {
		return b, nil
	}
	slices.SortFunc(at, func(x, y *token.Token) int {
		return cmp.Or(cmp.Compare(x.Position.Line, y.Position.Line), cmp.Compare(x.Position.Column, y.Position.Column))
	})
	lines := bytes.SplitAfter(b, []byte("\n"))
	for i := len(at) - 1; i >= 0; i-- { // last first, so earlier columns stay put
		p := at[i].Position
		l, c := p.Line-1, p.Column-1
		if l < 0 || l >= len(lines) || c < 0 || c+len(at[i].Value) > len(lines[l]) || string(lines[l][c:c+len(at[i].Value)]) != at[i].Value {
			return nil, fmt.Errorf("marshal limits: cannot quote %q at line %d", at[i].Value, p.Line)
		}
		lines[l] = slices.Concat(lines[l][:c], []byte(strconv.Quote(at[i].Value)), lines[l][c+len(at[i].Value):])
	}
	return bytes.Join(lines, nil), nil
}

// nonFinite collects the tokens of infinity and NaN scalars.
type nonFinite []*token.Token

func (v *nonFinite) Visit(n ast.Node) ast.Visitor {
	switch n.(type) {
	case *ast.InfinityNode, *ast.NanNode:
		*v = append(*v, n.GetToken())
	}
	return v
}

// MarshalLimitsJSON is the document of MarshalLimits as JSON (the same field names),
// which ParseLimits reads too.
func MarshalLimitsJSON(c Config) ([]byte, error) {
	b, err := json.Marshal(toLimitsFile(c))
	if err != nil {
		return nil, fmt.Errorf("marshal limits: %w", err)
	}
	return b, nil
}

// limitsFile is the document of a limits file: the YAML of `ratectl apply -f` and
// `ratectl export`, a Config on disk. A section left out is
// not managed; a section present adds and changes its objects, and deletes those it does
// not list only with --prune.
//
// `ratectl export -o json` prints the same document as JSON (the same field names), which
// apply -f also takes, JSON being YAML.
type limitsFile struct {
	Regions   *[]string       `yaml:"regions,omitempty" json:"regions,omitempty"`
	Rules     *[]ruleYAML     `yaml:"rules,omitempty" json:"rules,omitempty"`
	Overrides *[]overrideYAML `yaml:"overrides,omitempty" json:"overrides,omitempty"`
	Keys      *[]keyYAML      `yaml:"keys,omitempty" json:"keys,omitempty"`
	// Plans and the tenants assigned to them (regions.Plan): a plan listed is described
	// whole, its rules the file leaves out are deleted.
	Plans       *[]planYAML       `yaml:"plans,omitempty" json:"plans,omitempty"`
	TenantPlans *[]tenantPlanYAML `yaml:"tenant_plans,omitempty" json:"tenant_plans,omitempty"`
}

type planYAML struct {
	Name  string         `yaml:"name" json:"name"`
	Rules []planRuleYAML `yaml:"rules" json:"rules"`
}

// planRuleYAML is a rule of a plan: a rule without a tenant (every tenant of the plan).
type planRuleYAML struct {
	Route           string  `yaml:"route" json:"route"`
	Capacity        int64   `yaml:"capacity" json:"capacity"`
	RefillPerSecond float64 `yaml:"refill_per_second" json:"refill_per_second"`
	Shadow          bool    `yaml:"shadow,omitempty" json:"shadow,omitempty"`
	Shards          int     `yaml:"shards,omitempty" json:"shards,omitempty"`
	// Bands are the rule's further buckets (regions.Rule.Bands), in order.
	Bands []bandYAML `yaml:"bands,omitempty" json:"bands,omitempty"`
}

// bandYAML is one further limit of a rule: a name, a capacity and either exactly one of
// per (the capacity refills over it: 1h, 30d; see ParseBand) and refill_per_second, a
// token bucket, or a period (hour, day, week, month) and optionally a zone, a calendar
// quota of capacity per period.
type bandYAML struct {
	Name            string   `yaml:"name" json:"name"`
	Capacity        int64    `yaml:"capacity" json:"capacity"`
	Per             string   `yaml:"per,omitempty" json:"per,omitempty"`
	RefillPerSecond *float64 `yaml:"refill_per_second,omitempty" json:"refill_per_second,omitempty"`
	Period          string   `yaml:"period,omitempty" json:"period,omitempty"`
	Zone            string   `yaml:"zone,omitempty" json:"zone,omitempty"`
}

// bandsOf reads the bands of a rule (what names it in errors); none is nil.
func bandsOf(what string, ys []bandYAML) ([]regions.Band, error) {
	if len(ys) == 0 {
		return nil, nil
	}
	out := make([]regions.Band, 0, len(ys))
	for _, y := range ys {
		b := regions.Band{Name: y.Name, Capacity: y.Capacity}
		switch {
		case y.Period != "":
			p, ok := ParsePeriod(y.Period)
			switch {
			case !ok:
				return nil, fmt.Errorf("%w %s: band %s: %w", regions.ErrInvalid, what, y.Name, periodError(y.Period))
			case y.Per != "" || y.RefillPerSecond != nil:
				return nil, fmt.Errorf("%w %s: band %s: a calendar quota (period %s) is an amount per period: give no per or refill_per_second", regions.ErrInvalid, what, y.Name, p)
			}
			b.Period, b.Zone = p, y.Zone
		case y.Zone != "":
			return nil, fmt.Errorf("%w %s: band %s: zone %q is for a calendar quota: give a period (hour, day, week, month) too", regions.ErrInvalid, what, y.Name, y.Zone)
		case y.Per != "" && y.RefillPerSecond != nil:
			return nil, fmt.Errorf("%w %s: band %s: give per or refill_per_second, not both", regions.ErrInvalid, what, y.Name)
		case y.Per != "":
			r, err := RefillOver(y.Capacity, y.Per)
			if err != nil {
				return nil, fmt.Errorf("%w %s: band %s: %w", regions.ErrInvalid, what, y.Name, err)
			}
			b.RefillPerSecond = r
		case y.RefillPerSecond != nil:
			b.RefillPerSecond = *y.RefillPerSecond
		default:
			return nil, fmt.Errorf("%w %s: band %s: give per (1h, 30d) or refill_per_second for a token bucket, or period (hour, day, week, month) for a calendar quota", regions.ErrInvalid, what, y.Name)
		}
		out = append(out, b)
	}
	return out, nil
}

// bandsYAML is the file form of bs: per where it gives the refill exactly (BandPer).
func bandsYAML(bs []regions.Band) []bandYAML {
	if len(bs) == 0 {
		return nil
	}
	out := make([]bandYAML, 0, len(bs))
	for _, b := range bs {
		y := bandYAML{Name: b.Name, Capacity: b.Capacity}
		if b.Quota() {
			y.Period, y.Zone = string(b.Period), b.Zone
		} else if per, ok := BandPer(b); ok {
			y.Per = per
		} else {
			r := b.RefillPerSecond
			y.RefillPerSecond = &r
		}
		out = append(out, y)
	}
	return out
}

type tenantPlanYAML struct {
	Tenant string `yaml:"tenant" json:"tenant"`
	Plan   string `yaml:"plan" json:"plan"`
}

type ruleYAML struct {
	Tenant          string  `yaml:"tenant" json:"tenant"`
	Route           string  `yaml:"route" json:"route"`
	Capacity        int64   `yaml:"capacity" json:"capacity"`
	RefillPerSecond float64 `yaml:"refill_per_second" json:"refill_per_second"`
	Shadow          bool    `yaml:"shadow,omitempty" json:"shadow,omitempty"`
	Shards          int     `yaml:"shards,omitempty" json:"shards,omitempty"`
	// Bands are the rule's further buckets (regions.Rule.Bands), in order.
	Bands []bandYAML `yaml:"bands,omitempty" json:"bands,omitempty"`
}

type overrideYAML struct {
	Scope     string             `yaml:"scope" json:"scope"`
	Shares    map[string]float64 `yaml:"shares" json:"shares"`
	ExpiresAt string             `yaml:"expires_at,omitempty" json:"expires_at,omitempty"` // RFC 3339
	Reason    string             `yaml:"reason" json:"reason"`
}

type keyYAML struct {
	SHA256 string `yaml:"sha256" json:"sha256"` // hex SHA-256 of the secret (ratectl keys import --sha256)
	Tenant string `yaml:"tenant" json:"tenant"`
	Label  string `yaml:"label,omitempty" json:"label,omitempty"`
}

func (f limitsFile) config() (Config, error) {
	var c Config
	if f.Regions != nil {
		rs := append([]string{}, *f.Regions...)
		c.Regions = &rs
	}
	if f.Rules != nil {
		rs := []regions.Rule{}
		for _, r := range *f.Rules {
			bands, err := bandsOf("rule "+r.Tenant+"/"+r.Route, r.Bands)
			if err != nil {
				return c, fmt.Errorf("rules: %w", err)
			}
			rs = append(rs, regions.Rule{Tenant: r.Tenant, Route: r.Route, Capacity: r.Capacity, RefillPerSecond: r.RefillPerSecond, Shadow: r.Shadow, Shards: r.Shards, Bands: bands})
		}
		c.Rules = &rs
	}
	if f.Overrides != nil {
		os := []Override{}
		for _, o := range *f.Overrides {
			sc, err := regions.ParseScope(o.Scope)
			if err != nil {
				return c, fmt.Errorf("overrides: %w", err)
			}
			ov := Override{Scope: sc, Shares: o.Shares, Reason: o.Reason}
			if o.ExpiresAt != "" {
				t, err := time.Parse(time.RFC3339Nano, o.ExpiresAt)
				if err != nil {
					return c, fmt.Errorf("overrides %s: expires_at %q: want an RFC 3339 time like 2026-12-01T00:00:00Z", o.Scope, o.ExpiresAt)
				}
				ov.ExpiresAt = t
			}
			if ov.Shares == nil {
				ov.Shares = map[string]float64{}
			}
			os = append(os, ov)
		}
		c.Overrides = &os
	}
	if f.Keys != nil {
		ks := []KeySpec{}
		for _, k := range *f.Keys {
			h, err := ParseKeyHash(k.SHA256)
			if err != nil {
				return c, fmt.Errorf("keys (tenant %s): %w", k.Tenant, err)
			}
			ks = append(ks, KeySpec{Hash: h, Tenant: k.Tenant, Label: k.Label})
		}
		c.Keys = &ks
	}
	if f.Plans != nil {
		ps := []regions.Plan{}
		for _, p := range *f.Plans {
			rs := []regions.Rule{}
			for _, r := range p.Rules {
				bands, err := bandsOf("rule of plan "+p.Name+"/"+r.Route, r.Bands)
				if err != nil {
					return c, fmt.Errorf("plans: %w", err)
				}
				rs = append(rs, regions.Rule{Plan: p.Name, Tenant: regions.Wildcard, Route: r.Route, Capacity: r.Capacity,
					RefillPerSecond: r.RefillPerSecond, Shadow: r.Shadow, Shards: r.Shards, Bands: bands})
			}
			ps = append(ps, regions.Plan{Name: p.Name, Rules: rs})
		}
		c.Plans = &ps
	}
	if f.TenantPlans != nil {
		tps := []regions.TenantPlan{}
		for _, tp := range *f.TenantPlans {
			tps = append(tps, regions.TenantPlan{Tenant: tp.Tenant, Plan: tp.Plan})
		}
		c.TenantPlans = &tps
	}
	return c, nil
}

// ParseKeyHash reads the SHA-256 of a key's secret as 64 hex digits (an optional
// "sha256:" prefix allowed), as a limits file and ratectl keys import --sha256 write it.
func ParseKeyHash(s string) (regions.KeyHash, error) {
	var h regions.KeyHash
	s = strings.TrimPrefix(strings.TrimSpace(s), "sha256:")
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(h) {
		if len(s) > 80 {
			s = s[:80] + "..."
		}
		return h, fmt.Errorf("sha256 %q: want 64 hex digits (sha256sum of the key)", s)
	}
	copy(h[:], b)
	return h, nil
}

// toLimitsFile is the YAML form of cfg (the inverse of config).
func toLimitsFile(cfg Config) limitsFile {
	var f limitsFile
	if cfg.Regions != nil {
		rs := append([]string{}, *cfg.Regions...)
		f.Regions = &rs
	}
	if cfg.Rules != nil {
		rs := []ruleYAML{}
		for _, r := range *cfg.Rules {
			y := ruleYAML{Tenant: r.Tenant, Route: r.Route, Capacity: r.Capacity, RefillPerSecond: r.RefillPerSecond, Shadow: r.Shadow, Bands: bandsYAML(r.Bands)}
			if r.Shards != 1 {
				y.Shards = r.Shards
			}
			rs = append(rs, y)
		}
		f.Rules = &rs
	}
	if cfg.Overrides != nil {
		os := []overrideYAML{}
		for _, o := range *cfg.Overrides {
			y := overrideYAML{Scope: o.Scope.String(), Shares: o.Shares, Reason: o.Reason}
			if !o.ExpiresAt.IsZero() {
				y.ExpiresAt = o.ExpiresAt.UTC().Format(time.RFC3339Nano)
			}
			os = append(os, y)
		}
		f.Overrides = &os
	}
	if cfg.Keys != nil {
		ks := []keyYAML{}
		for _, k := range *cfg.Keys {
			ks = append(ks, keyYAML{SHA256: hex.EncodeToString(k.Hash[:]), Tenant: k.Tenant, Label: k.Label})
		}
		f.Keys = &ks
	}
	if cfg.Plans != nil {
		ps := []planYAML{}
		for _, p := range *cfg.Plans {
			y := planYAML{Name: p.Name, Rules: []planRuleYAML{}}
			for _, r := range p.Rules {
				ry := planRuleYAML{Route: r.Route, Capacity: r.Capacity, RefillPerSecond: r.RefillPerSecond, Shadow: r.Shadow, Bands: bandsYAML(r.Bands)}
				if r.Shards != 1 {
					ry.Shards = r.Shards
				}
				y.Rules = append(y.Rules, ry)
			}
			ps = append(ps, y)
		}
		f.Plans = &ps
	}
	if cfg.TenantPlans != nil {
		tps := []tenantPlanYAML{}
		for _, tp := range *cfg.TenantPlans {
			tps = append(tps, tenantPlanYAML{Tenant: tp.Tenant, Plan: tp.Plan})
		}
		f.TenantPlans = &tps
	}
	return f
}

// Budgets of a limits file beyond its size (MaxLimitsSize): a control plane's
// configuration, not a data set, and never a denial of service. maxLimitsNodes bounds the
// YAML nodes once every alias is expanded, so a "billion laughs" file of a few hundred
// bytes fails at once instead of growing to gigabytes; 100,000 rules take about 2 million.
const (
	maxLimitsNodes = 5_000_000
	maxLimitsDepth = 64
)

// field kinds the strict check knows: YAML reads an unquoted 0042 as a number and
// `capacity: 20.7` as a float, which a lenient decoder turns into "34" and 20.
type fieldKind int

const (
	kindString fieldKind = iota // an id or text: must be a YAML string
	kindInt                     // a whole number
)

// limitsSchema is the kind of each checked field of the sections' entries; the shares
// map's keys (region ids) are strings too. The decoder checks the rest (unknown fields,
// a list where a map belongs).
var limitsSchema = map[string]map[string]fieldKind{
	"rules":     {"tenant": kindString, "route": kindString, "capacity": kindInt, "shards": kindInt},
	"overrides": {"scope": kindString, "expires_at": kindString, "reason": kindString},
	"keys":      {"sha256": kindString, "tenant": kindString, "label": kindString},
	"plans":     {"name": kindString},
	// The entries of a plan's rules list.
	"plans.rules":  {"route": kindString, "capacity": kindInt, "shards": kindInt},
	"tenant_plans": {"tenant": kindString, "plan": kindString},
	// The entries of a rule's (or a plan's rule's) bands list.
	"bands": {"name": kindString, "capacity": kindInt, "per": kindString, "period": kindString, "zone": kindString},
}

// decodeLimits decodes a limits file strictly, and stops when ctx ends (SIGTERM, the
// deadline): one YAML document, at most maxLimitsNodes nodes with aliases expanded, ids
// and text as YAML strings whatever they look like, whole numbers where a count belongs,
// no unknown fields. Errors name the line and the field.
func decodeLimits(ctx context.Context, data []byte) (limitsFile, error) {
	if ctx.Err() != nil {
		return limitsFile{}, fmt.Errorf("reading stopped: %w", context.Cause(ctx))
	}
	type result struct {
		f   limitsFile
		err error
	}
	done := make(chan result, 1)
	go func() {
		// goccy/go-yaml may panic on malformed input (see gateway.ParseConfig).
		defer func() {
			if p := recover(); p != nil {
				done <- result{err: errors.New("not valid YAML")}
			}
		}()
		f, err := decodeLimitsNow(ctx, data)
		done <- result{f, err}
	}()
	select {
	case r := <-done:
		return r.f, r.err
	case <-ctx.Done():
		// The parser cannot be interrupted: its goroutine ends when it returns (the input
		// is at most MaxLimitsSize; the node walk checks ctx as it goes).
		return limitsFile{}, fmt.Errorf("reading stopped: %w", context.Cause(ctx))
	}
}

func decodeLimitsNow(ctx context.Context, data []byte) (limitsFile, error) {
	file, err := parser.ParseBytes(data, 0)
	if err != nil {
		return limitsFile{}, errors.New(yamlError(err))
	}
	var docs []*ast.DocumentNode
	for _, d := range file.Docs {
		if d != nil && d.Body != nil {
			docs = append(docs, d)
		}
	}
	switch {
	case len(docs) == 0:
		return limitsFile{}, errors.New("the file is empty")
	case len(docs) > 1:
		return limitsFile{}, fmt.Errorf("line %d: a second YAML document (after ---): a limits file holds one", line(docs[1].Body))
	}
	body := docs[0].Body
	w := &nodeWalk{ctx: ctx, anchors: map[string]ast.Node{}, sizes: map[string]int{}}
	if _, err := w.size(body, 0); err != nil {
		return limitsFile{}, err
	}
	if err := w.checkTypes(body); err != nil {
		return limitsFile{}, err
	}
	if err := ctx.Err(); err != nil {
		return limitsFile{}, err
	}
	var f limitsFile
	if err := yaml.NodeToValue(body, &f, yaml.DisallowUnknownField()); err != nil {
		return limitsFile{}, errors.New(yamlError(err))
	}
	return f, nil
}

// yamlError is a goccy/go-yaml error on one line, with its position.
func yamlError(err error) string {
	return strings.Join(strings.Fields(yaml.FormatError(err, false, false)), " ")
}

func line(n ast.Node) int {
	if t := n.GetToken(); t != nil && t.Position != nil {
		return t.Position.Line
	}
	return 0
}

// nodeWalk measures the document with aliases expanded and knows its anchors.
type nodeWalk struct {
	ctx     context.Context
	anchors map[string]ast.Node // anchor name: its value, as the decoder resolves them
	sizes   map[string]int      // anchor name: its expanded size
	total   int
	visits  int
}

// size is the number of nodes under n with aliases expanded; it fails once the whole
// document passes maxLimitsNodes, nests deeper than maxLimitsDepth, or ctx ends.
func (w *nodeWalk) size(n ast.Node, depth int) (int, error) {
	if n == nil {
		return 0, nil
	}
	if depth > maxLimitsDepth {
		return 0, fmt.Errorf("line %d: nested deeper than %d levels", line(n), maxLimitsDepth)
	}
	if w.visits++; w.visits%4096 == 0 {
		if err := w.ctx.Err(); err != nil {
			return 0, err
		}
	}
	var (
		own      = 1
		children []ast.Node
	)
	switch v := n.(type) {
	case *ast.MappingNode:
		for _, mv := range v.Values {
			children = append(children, mv.Key, mv.Value)
		}
	case *ast.MappingValueNode:
		children = []ast.Node{v.Key, v.Value}
	case *ast.SequenceNode:
		children = v.Values
	case *ast.TagNode:
		children = []ast.Node{v.Value}
	case *ast.MappingKeyNode: // ? KEY: a complex key may hold aliases too
		children = []ast.Node{v.Value}
	case *ast.AnchorNode:
		s, err := w.size(v.Value, depth+1)
		if err != nil {
			return 0, err
		}
		name := v.Name.GetToken().Value
		w.anchors[name], w.sizes[name] = v.Value, s
		return s, nil
	case *ast.AliasNode:
		s := w.sizes[v.Value.GetToken().Value]
		if s == 0 {
			s = 1 // an unknown alias: the decoder names it
		}
		w.total += s
		if w.total > maxLimitsNodes {
			return 0, fmt.Errorf("line %d: more than %d YAML nodes once aliases are expanded (alias *%s): refusing a file that expands so far", line(n), maxLimitsNodes, v.Value.GetToken().Value)
		}
		return s, nil
	}
	w.total += own
	if w.total > maxLimitsNodes {
		return 0, fmt.Errorf("line %d: more than %d YAML nodes: refusing a file this large", line(n), maxLimitsNodes)
	}
	sum := own
	for _, c := range children {
		s, err := w.size(c, depth+1)
		if err != nil {
			return 0, err
		}
		sum += s
		if sum > maxLimitsNodes {
			sum = maxLimitsNodes + 1
		}
	}
	return sum, nil
}

// resolve is n without its anchor or alias: the node the decoder reads.
func (w *nodeWalk) resolve(n ast.Node) ast.Node {
	for range maxLimitsDepth {
		switch v := n.(type) {
		case *ast.AnchorNode:
			n = v.Value
		case *ast.AliasNode:
			t, ok := w.anchors[v.Value.GetToken().Value]
			if !ok {
				return n
			}
			n = t
		default:
			return n
		}
	}
	return n
}

// checkTypes refuses the scalars of body's known fields that YAML reads as another type
// than the field's: an id written 0042 or 1.10 (a number), a capacity of 20.7.
func (w *nodeWalk) checkTypes(body ast.Node) error {
	top, ok := w.resolve(body).(*ast.MappingNode)
	if !ok {
		return nil // the decoder says what is wrong
	}
	for _, section := range top.Values {
		name := section.Key.GetToken().Value
		list, ok := w.resolve(section.Value).(*ast.SequenceNode)
		if !ok {
			continue
		}
		for i, e := range list.Values {
			path := fmt.Sprintf("%s[%d]", name, i)
			if name == "regions" {
				if err := w.checkScalar(e, path, kindString); err != nil {
					return err
				}
				continue
			}
			fields, known := limitsSchema[name]
			entry, ok := w.resolve(e).(*ast.MappingNode)
			if !known || !ok {
				continue
			}
			for _, kv := range entry.Values {
				key := kv.Key.GetToken().Value
				if kind, ok := fields[key]; ok {
					if err := w.checkScalar(kv.Value, path+"."+key, kind); err != nil {
						return err
					}
				}
				if name == "rules" && key == "bands" {
					if err := w.checkEntries(kv.Value, path+".bands", limitsSchema["bands"]); err != nil {
						return err
					}
				}
				if name == "plans" && key == "rules" {
					if err := w.checkEntries(kv.Value, path+".rules", limitsSchema["plans.rules"]); err != nil {
						return err
					}
				}
				if name == "overrides" && key == "shares" {
					if shares, ok := w.resolve(kv.Value).(*ast.MappingNode); ok {
						for _, sh := range shares.Values {
							if err := w.checkScalar(sh.Key, path+".shares key", kindString); err != nil {
								return err
							}
						}
					}
				}
			}
		}
	}
	return nil
}

// checkEntries checks the known fields of each entry of the list n (path names it).
func (w *nodeWalk) checkEntries(n ast.Node, path string, fields map[string]fieldKind) error {
	list, ok := w.resolve(n).(*ast.SequenceNode)
	if !ok {
		return nil // the decoder says what is wrong
	}
	for i, e := range list.Values {
		entry, ok := w.resolve(e).(*ast.MappingNode)
		if !ok {
			continue
		}
		for _, kv := range entry.Values {
			key := kv.Key.GetToken().Value
			if kind, ok := fields[key]; ok {
				if err := w.checkScalar(kv.Value, fmt.Sprintf("%s[%d].%s", path, i, key), kind); err != nil {
					return err
				}
			}
			if key == "bands" && strings.HasSuffix(path, ".rules") { // a plan's rule's bands
				if err := w.checkEntries(kv.Value, fmt.Sprintf("%s[%d].bands", path, i), limitsSchema["bands"]); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (w *nodeWalk) checkScalar(n ast.Node, path string, kind fieldKind) error {
	v := w.resolve(n)
	if t, ok := v.(*ast.TagNode); ok {
		v = w.resolve(t.Value) // the decoder reads `!!str 1.10` as "1.1": judge what is written
	}
	var what string
	switch v.(type) {
	case *ast.StringNode, *ast.LiteralNode:
		return nil // for a count, "12": the decoder refuses it
	case *ast.IntegerNode:
		if kind == kindInt {
			return nil
		}
		what = "a number"
	case *ast.FloatNode, *ast.InfinityNode, *ast.NanNode:
		if kind == kindInt {
			return fmt.Errorf("line %d: %s: %s is not a whole number", line(v), path, v.GetToken().Value)
		}
		what = "a number"
	case *ast.BoolNode:
		what = "a boolean"
	case *ast.NullNode:
		what = "null"
	default:
		return nil
	}
	written := v.GetToken().Value
	if kind == kindInt {
		return fmt.Errorf("line %d: %s: %q is %s, not a whole number", line(v), path, written, what)
	}
	if what == "null" {
		return fmt.Errorf("line %d: %s: no value", line(v), path)
	}
	return fmt.Errorf("line %d: %s: %s is read by YAML as %s, not as the text written: quote it (\"%s\")", line(v), path, written, what, written)
}
