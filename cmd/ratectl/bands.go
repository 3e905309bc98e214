package main

import (
	"strings"

	"github.com/spf13/pflag"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// bandEdit is what the --band and --no-bands flags of `rules set` and `plans set` do to
// a rule's bands: --no-bands drops them all first; each --band NAME=CAPACITY/PER (or
// NAME=CAPACITY@REFILL, or a quota NAME=AMOUNT/PERIOD[@ZONE]) sets band NAME, in place if the rule has it, else after the
// others; --band NAME= removes band NAME.
type bandEdit struct {
	clear  bool
	set    []regions.Band
	remove map[string]bool
}

const bandFlagUsage = "a further bucket NAME=CAPACITY/PER (hour=10000/1h, day=1000000/30d) or NAME=CAPACITY@REFILL_PER_SECOND, or a calendar quota NAME=AMOUNT/PERIOD[@ZONE] (PERIOD hour, day, week or month: month=1000000/month, day=5000/day@Europe/Berlin); NAME= removes band NAME; repeatable"

func addBandFlags(f *pflag.FlagSet, specs *[]string, clear *bool) {
	f.StringArrayVar(specs, "band", nil, bandFlagUsage)
	f.BoolVar(clear, "no-bands", false, "remove every band of the rule (before any --band)")
}

// bandsChanged reports whether f holds a band flag (--band or --no-bands).
func bandsChanged(f *pflag.FlagSet) bool { return f.Changed("band") || f.Changed("no-bands") }

// parseBandFlags reads the --band values: each a band or NAME= (remove), each name once.
func parseBandFlags(specs []string, clear bool) (bandEdit, error) {
	e := bandEdit{clear: clear, remove: map[string]bool{}}
	seen := map[string]bool{}
	for _, s := range specs {
		name, spec, _ := strings.Cut(s, "=")
		if seen[name] {
			return e, usagef("--band %q: band %s is given twice", s, name)
		}
		seen[name] = true
		if strings.HasSuffix(s, "=") && spec == "" && name != "" {
			if err := regions.ValidateID("band", name); err != nil {
				return e, usagef("--band %q: %v", s, err)
			}
			e.remove[name] = true
			continue
		}
		b, err := store.ParseBand(s)
		if err != nil {
			return e, usagef("--band %q: %v", s, err)
		}
		e.set = append(e.set, b)
	}
	return e, nil
}

// apply is the bands of a rule that had old after the edit; removing a band the rule
// does not have is an error (a typo would otherwise do nothing).
func (e bandEdit) apply(old []regions.Band) ([]regions.Band, error) {
	if e.clear {
		old = nil
	}
	had := map[string]bool{}
	for _, b := range old {
		had[b.Name] = true
	}
	for name := range e.remove {
		if !had[name] {
			return nil, usagef("--band %s=: the rule has no band %s to remove", name, name)
		}
	}
	setBy := map[string]regions.Band{}
	for _, b := range e.set {
		setBy[b.Name] = b
	}
	var out []regions.Band
	for _, b := range old {
		switch n, ok := setBy[b.Name]; {
		case e.remove[b.Name]:
		case ok:
			out = append(out, n)
		default:
			out = append(out, b)
		}
	}
	for _, b := range e.set {
		if !had[b.Name] {
			out = append(out, b)
		}
	}
	return out, nil
}

// editBands is the bands of nr, whose stored rule (if any) has old: old after the band
// flags of f. A rule with bands is checked here (a usage error, nothing written): the
// names, duplicates, the numbers, and one shard.
func editBands(f *pflag.FlagSet, e bandEdit, old []regions.Band, nr regions.Rule) ([]regions.Band, error) {
	bands := old
	if bandsChanged(f) {
		var err error
		if bands, err = e.apply(old); err != nil {
			return nil, err
		}
	}
	if len(bands) > 0 {
		nr.Bands = bands
		if nr.Shards == 0 {
			nr.Shards = 1
		}
		if err := nr.Validate(); err != nil {
			return nil, usageError{err}
		}
	}
	return bands, nil
}

// bandsCell is a rule's bands in a table: hour=10000/1h,month=1000000/month; "-" for none.
func bandsCell(bs []regions.Band) string {
	if len(bs) == 0 {
		return "-"
	}
	return store.FormatBands(bs)
}
