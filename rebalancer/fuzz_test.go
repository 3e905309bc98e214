package rebalancer

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

// bytesReader decodes fuzz input; it returns zeros when the input runs out.
type bytesReader struct{ b []byte }

func (r *bytesReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *bytesReader) u16() uint16 { return uint16(r.byte())<<8 | uint16(r.byte()) }

// rate is a request rate: usually a plausible one, sometimes 0, huge or raw float bits.
func (r *bytesReader) rate() float64 {
	switch mode := r.byte(); {
	case mode < 200:
		return float64(r.u16()) / 16
	case mode < 230:
		return 0
	case mode < 250:
		return float64(r.u16()) * 1e9
	default:
		var b [8]byte
		for i := range b {
			b[i] = r.byte()
		}
		return math.Float64frombits(binary.LittleEndian.Uint64(b[:]))
	}
}

var fuzzRegions = []string{"us-east", "eu-west", "ap-south", "sa-east", "af-south", "me-central", "ca-central", "eu-north"}

// FuzzAllocate checks the allocation's invariants on arbitrary inputs: every share in
// [floor, 1], the sum 1 within 1e-9, no NaN, an unknown share unchanged whenever that is
// feasible, and shrink-before-grow never enforcing more than 1. Invalid inputs must be
// errors, never panics or bad shares.
func FuzzAllocate(f *testing.F) {
	f.Add([]byte{2, 0, 0, 100, 0, 0, 0, 0, 0, 100, 0, 0, 128})
	f.Add([]byte{3, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 250, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3})
	f.Add([]byte{1, 0, 0, 255, 255, 0, 0, 0, 0, 0, 0, 0, 255})
	f.Add([]byte{2, 0, 0, 255, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xef, 0x7f, 255, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xef, 0x7f})
	f.Add([]byte{4, 1, 1, 1, 1, 2, 2, 2, 2, 0, 100, 0, 0, 0, 100, 0, 0, 200, 250, 250, 250, 250, 250, 250, 250, 250})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &bytesReader{b: data}
		n := int(r.byte()%uint8(len(fuzzRegions))) + 1
		cfg := DefaultConfig(n)
		in := make([]RegionInput, n)
		raw := make([]float64, n)
		for i := range in {
			in[i].Region = fuzzRegions[i]
			in[i].Status = [...]Status{StatusOK, StatusUnknown, StatusDark}[r.byte()%3]
		}
		for i := range in {
			in[i].Long = Rates{r.rate(), r.rate()}
			in[i].Short = Rates{r.rate(), r.rate()}
			raw[i] = float64(r.byte()) / 255
		}
		// Current shares: usually a valid split (normalised), sometimes as drawn.
		if r.byte()%4 != 0 {
			sum := 0.0
			for _, v := range raw {
				sum += v
			}
			for i := range raw {
				if sum > 0 {
					raw[i] /= sum
				} else {
					raw[i] = 1 / float64(n)
				}
			}
		}
		for i := range in {
			in[i].Share = raw[i]
		}
		refill := float64(r.u16()%10000 + 1)
		lim := regions.Limit{Capacity: 1, RefillPerSecond: refill}
		st := State{At: time.Unix(0, 0), Regions: map[string]RegionState{}}
		for _, reg := range in {
			st.Regions[reg.Region] = RegionState{Peak: r.rate(), Status: [...]Status{StatusOK, StatusDark}[r.byte()%2]}
		}
		now := time.Unix(int64(r.u16()), 0)

		a, err := Allocate(cfg, lim, now, in, st)
		valid := true
		for _, reg := range in {
			if reg.Status != StatusOK {
				continue
			}
			for _, v := range []float64{reg.Long.Allowed, reg.Long.Throttled, reg.Short.Allowed, reg.Short.Throttled} {
				valid = valid && !math.IsNaN(v) && !math.IsInf(v, 0) && v >= 0
			}
			valid = valid && !math.IsInf(reg.Long.Offered(), 0) && !math.IsInf(reg.Short.Offered(), 0)
		}
		if !valid {
			if err == nil {
				t.Fatalf("invalid rates accepted: %+v", in)
			}
			return
		}
		if err != nil {
			t.Fatalf("Allocate(%+v): %v", in, err)
		}
		checkInvariants(t, cfg, in, a)

		// Unknown shares are kept exactly when that is feasible: each in [floor, 1], at
		// least one ok region to absorb the rest, and a floor left for every other region.
		ok, kept, others := 0, 0.0, 0
		feasible := true
		for _, reg := range in {
			switch reg.Status {
			case StatusOK:
				ok++
				others++
			case StatusDark:
				others++
			case StatusUnknown:
				kept += reg.Share
				feasible = feasible && reg.Share >= cfg.Floor && reg.Share <= 1
			}
		}
		feasible = feasible && ok > 0 && kept+float64(others)*cfg.Floor <= 1-1e-9
		for _, reg := range in {
			switch {
			case reg.Status == StatusUnknown && feasible && math.Abs(a.Shares[reg.Region]-reg.Share) > 1e-9:
				t.Fatalf("unknown %s moved from %v to %v though keeping it was feasible: %+v", reg.Region, reg.Share, a.Shares[reg.Region], in)
			case reg.Status == StatusDark && ok+countStatus(in, StatusUnknown) > 0 && math.Abs(a.Shares[reg.Region]-cfg.Floor) > 1e-9:
				t.Fatalf("dark %s got %v, want the floor %v", reg.Region, a.Shares[reg.Region], cfg.Floor)
			}
		}
		for _, rs := range a.State.Regions {
			if math.IsNaN(rs.Peak) || rs.Peak < 0 {
				t.Fatalf("state peak %v", rs.Peak)
			}
		}

		old := make(map[string]float64, n)
		sum := 0.0
		for _, reg := range in {
			old[reg.Region] = reg.Share
			sum += reg.Share
		}
		if math.Abs(sum-1) <= 1e-9 {
			first, second := Plan(old, a.Shares)
			checkPlan(t, old, a.Shares, first, second)
		}
		ShouldWrite(cfg, lim, in, a.Shares)
		FastPathTrigger(cfg, lim, in, st)
	})
}

func countStatus(in []RegionInput, s Status) int {
	n := 0
	for _, r := range in {
		if r.Status == s {
			n++
		}
	}
	return n
}
