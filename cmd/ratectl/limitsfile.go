package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
)

// Budgets of a limits file beyond its size (maxLimitsFile): a control plane's
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
}

// decodeLimits decodes a limits file strictly, and stops when ctx ends (SIGTERM, the
// deadline): one YAML document, at most maxLimitsNodes nodes with aliases expanded, ids
// and text as YAML strings whatever they look like, whole numbers where a count belongs,
// no unknown fields. Errors name the line and the field.
func decodeLimits(ctx context.Context, data []byte) (limitsFile, error) {
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
		// The parser cannot be interrupted: its goroutine is left to the exiting process.
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

// limitsDeadline bounds reading and decoding a limits file.
const limitsDeadline = 30 * time.Second

// readLimitsBytes reads path ("-": stdin), at most maxLimitsFile+1 bytes, until ctx ends:
// a stdin that never closes must not hold the command past SIGTERM.
func readLimitsBytes(ctx context.Context, stdin io.Reader, path string) ([]byte, error) {
	type result struct {
		data []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		if path == "-" {
			r.data, r.err = io.ReadAll(io.LimitReader(stdin, maxLimitsFile+1))
			if r.err != nil {
				r.err = fmt.Errorf("read: %w", r.err) // the caller unwraps one level
			}
		} else {
			r.data, r.err = readFileLimited(path)
		}
		done <- r
	}()
	select {
	case r := <-done:
		return r.data, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("reading stopped: %w", context.Cause(ctx))
	}
}

// readFileLimited reads at most maxLimitsFile+1 bytes of path.
func readFileLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxLimitsFile+1))
	if err != nil {
		return nil, &os.PathError{Op: "read", Path: path, Err: err}
	}
	return b, nil
}
