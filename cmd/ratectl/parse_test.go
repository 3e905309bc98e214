package main

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestParseShares(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want map[string]float64
		err  string
	}{
		{"separate args", []string{"us-east=0.7", "eu-west=0.3"}, map[string]float64{"us-east": 0.7, "eu-west": 0.3}, ""},
		{"comma list", []string{"us-east=0.7,eu-west=0.3"}, map[string]float64{"us-east": 0.7, "eu-west": 0.3}, ""},
		{"spaces and trailing comma", []string{" us-east = 0.7 , eu-west=.3,"}, map[string]float64{"us-east": 0.7, "eu-west": 0.3}, ""},
		{"exponent", []string{"a=5e-1", "b=0.5"}, map[string]float64{"a": 0.5, "b": 0.5}, ""},
		{"one", []string{"solo=1"}, map[string]float64{"solo": 1}, ""},
		{"none", nil, nil, "no shares given"},
		{"empty items", []string{",,"}, nil, "no shares given"},
		{"no equals", []string{"us-east"}, nil, `share "us-east": want REGION=SHARE`},
		{"bad region", []string{"us east=1"}, nil, `invalid region id "us east"`},
		{"empty region", []string{"=1"}, nil, "invalid region id: empty"},
		{"empty share", []string{"a="}, nil, "empty number"},
		{"not a number", []string{"a=half"}, nil, `"half" is not a decimal number`},
		{"hex", []string{"a=0x1p-1"}, nil, `"0x1p-1" is not a decimal number`},
		{"nan", []string{"a=NaN"}, nil, `"NaN" is not a decimal number`},
		{"inf", []string{"a=inf"}, nil, `"inf" is not a decimal number`},
		{"huge", []string{"a=1e999"}, nil, `"1e999" is not a decimal number`},
		{"negative", []string{"a=-0.2", "b=1.2"}, nil, "share -0.2 is negative"},
		{"zero", []string{"a=0", "b=1"}, nil, "share 0 would reject all of the region's traffic"},
		{"above one", []string{"a=1.5"}, nil, "share 1.5 is more than 1"},
		{"duplicate", []string{"a=0.5", "a=0.5"}, nil, "region a is named twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseShares(tc.args)
			if tc.err != "" {
				var u usageError
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.As(err, &u) {
					t.Fatalf("parseShares(%q) error = %v, want a usage error containing %q", tc.args, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseShares(%q): %v", tc.args, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("parseShares(%q) = %v, want %v", tc.args, got, tc.want)
			}
		})
	}
}

// FuzzParseShares checks that the REGION=SHARE parser never panics, accepts only valid
// regions and shares in (0, 1], and that its canonical form parses back to the same map.
func FuzzParseShares(f *testing.F) {
	for _, s := range []string{"us-east=0.7,eu-west=0.3", "a=1", "a=.5, b=5e-1", "a=0", "x=-1", "a=1,a=1", "=", ",", "a==1", "a=1e-320", "é=0.5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		m, err := parseShares(strings.Fields(in))
		if err != nil {
			var u usageError
			if !errors.As(err, &u) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q is not a one-line usage error", err)
			}
			return
		}
		if len(m) == 0 {
			t.Fatal("success with no shares")
		}
		for r, v := range m {
			if err := checkID("region", r); err != nil {
				t.Fatalf("accepted region %q: %v", r, err)
			}
			if !(v > 0 && v <= 1) || math.IsNaN(v) {
				t.Fatalf("accepted share %v for %s", v, r)
			}
		}
		back, err := parseShares([]string{formatShares(m)})
		if err != nil {
			t.Fatalf("canonical form %q does not parse: %v", formatShares(m), err)
		}
		if !reflect.DeepEqual(back, m) {
			t.Fatalf("round trip %v -> %q -> %v", m, formatShares(m), back)
		}
	})
}

func TestOneLineHidesSecrets(t *testing.T) {
	url := "postgres://ops:s3cr%2Ft@db.example:5433/quota?sslmode=disable"
	a := &app{databaseURL: url, getenv: func(string) string { return "" }}
	err := errors.New("connect " + url + "\nfailed: password s3cr/t rejected")
	got := oneLine(err, a.secrets())
	if strings.Contains(got, "s3cr") || strings.Contains(got, "\n") {
		t.Errorf("oneLine = %q", got)
	}
	if hp := urlHostPort(url, "5432"); hp != "db.example:5433" {
		t.Errorf("urlHostPort = %q", hp)
	}
	if hp := urlHostPort("host=10.0.0.1 port=6000 user=x password=y", "5432"); hp != "10.0.0.1:6000" {
		t.Errorf("urlHostPort(dsn) = %q", hp)
	}
}
