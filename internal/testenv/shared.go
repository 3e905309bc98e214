package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// ModuleRoot is the directory of the quotaplane module's go.mod, for programs and tests
// that build binaries or read files of the source tree.
func ModuleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("find the module (is Go installed?): %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run from inside the quotaplane module")
	}
	return filepath.Dir(mod), nil
}

// LabelsMatch reports whether m has every label pair of match ("name", "value", ...).
func LabelsMatch(m *dto.Metric, match []string) bool {
	for i := 0; i+1 < len(match); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == match[i] && l.GetValue() == match[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// ExactAdmitted is what one exact token bucket of capacity tokens refilling at refill
// per second, full at the first arrival, admits for arrivals (requests per millisecond
// since the first, each costing 1, those of one millisecond taken at its start). It is
// the reference accuracy is measured against: with arrivals always above the refill it
// is capacity + refill x elapsed, and a stall of the load itself (the driver not
// scheduled on a busy machine) lowers it rather than biasing the measured error.
func ExactAdmitted(capacity int64, refill float64, arrivals []int64) int64 {
	tokens, admitted := float64(capacity), int64(0)
	perMs := refill / 1000
	for i, n := range arrivals {
		if i > 0 {
			tokens = min(float64(capacity), tokens+perMs)
		}
		take := min(n, int64(tokens+1e-9))
		tokens -= float64(take)
		admitted += take
	}
	return admitted
}

// LoadAverage is /proc/loadavg's 1, 5 and 15 minute figures ("0.52 0.61 0.70"), or
// "unknown": the machine's business beside a measurement, for the reports that print one.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
