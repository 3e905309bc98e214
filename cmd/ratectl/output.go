package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// render writes v as indented JSON with -o json, else calls table with an aligned writer.
// JSON field names are part of ratectl's interface (docs/ratectl.md lists them).
func (a *app) render(cmd *cobra.Command, v any, table func(w io.Writer)) error {
	out := cmd.OutOrStdout()
	if a.output == outputJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			return fmt.Errorf("write json: %w", err)
		}
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	table(tw)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// refuseJSON is the usage error of a command that has no JSON form, with -o json: a
// script asking for JSON must not get something else on stdout.
func (a *app) refuseJSON(cmd *cobra.Command, why string) error {
	if a.output == outputJSON {
		return usagef("%s does not support -o json: %s", cmd.CommandPath(), why)
	}
	return nil
}

// row writes one tab-separated table row.
func row(w io.Writer, cells ...string) {
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// timeCell formats a time for a table: RFC 3339 in UTC to the second, "-" when zero.
func timeCell(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// jsonTime is a time that is null in JSON when zero, else RFC 3339 in UTC.
func jsonTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC().Truncate(time.Microsecond)
	return &u
}

// shareCell formats a share as a fraction with up to 4 decimals.
func shareCell(v float64) string { return strconv.FormatFloat(v, 'f', 4, 64) }

// rateCell formats a rate (tokens or requests per second) with at most 3 decimals, or 3
// significant digits below 0.001.
func rateCell(v float64) string {
	if v != 0 && math.Abs(v) < 0.001 {
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
	return strconv.FormatFloat(math.Round(v*1000)/1000, 'f', -1, 64)
}

// sig rounds v to 12 significant digits, so JSON shows 0.00003 rather than the
// 0.000030000000000000004 a product of shares and rates can make.
func sig(v float64) float64 {
	r, err := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 12, 64), 64)
	if err != nil {
		return v
	}
	return r
}

// boolCell is "yes" or "no".
func boolCell(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// orDash returns s, or "-" when s is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
