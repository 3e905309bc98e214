package deploycheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/goccy/go-yaml"
	"google.golang.org/protobuf/encoding/protojson"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	// The other typed_config types envoy.yaml names, registered for protojson's Any.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// TestEnvoyExampleIsAValidBootstrap decodes envoy.yaml strictly into Envoy's bootstrap
// type (unknown fields are errors) and runs Envoy's own validation rules on it, then
// checks the rate-limit wiring docs/proxies.md describes.
func TestEnvoyExampleIsAValidBootstrap(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(DeployDir(), "envoy", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("envoy.yaml is not an Envoy v3 bootstrap: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml fails Envoy's validation: %v", err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	if err := hcm.ValidateAll(); err != nil {
		t.Fatalf("http_connection_manager: %v", err)
	}
	// Safe by default (issue 21): the edge listener decides the client address from the
	// connection, not from a client-written X-Forwarded-For, and normalises the path the
	// way the gateway's routing rules and the application expect.
	if !hcm.GetUseRemoteAddress().GetValue() || hcm.GetXffNumTrustedHops() != 0 {
		t.Errorf("use_remote_address %v, xff_num_trusted_hops %d: want true and 0 at the edge", hcm.GetUseRemoteAddress(), hcm.GetXffNumTrustedHops())
	}
	if !hcm.GetNormalizePath().GetValue() || !hcm.GetMergeSlashes() || hcm.GetPathWithEscapedSlashesAction() != hcmv3.HttpConnectionManager_REJECT_REQUEST {
		t.Errorf("normalize_path %v merge_slashes %v path_with_escaped_slashes_action %v: want true, true, REJECT_REQUEST",
			hcm.GetNormalizePath(), hcm.GetMergeSlashes(), hcm.GetPathWithEscapedSlashesAction())
	}
	vh := hcm.GetRouteConfig().GetVirtualHosts()[0]
	// Every descriptor that can reach the unauthenticated guard carries remote_address,
	// or the guard cannot tell clients apart and is not applied.
	for i, rl := range vh.GetRateLimits() {
		if !hasRemoteAddress(rl.GetActions()) {
			t.Errorf("virtual host rate_limits[%d]: no remote_address action", i)
		}
	}
	var keys []string
	for _, r := range vh.GetRoutes() {
		if cs := r.GetMatch().GetCaseSensitive(); cs == nil || cs.GetValue() {
			t.Errorf("route %v: case_sensitive %v, want false (an application that routes /Orders as /orders)", r.GetMatch(), cs)
		}
		for _, rl := range r.GetRoute().GetRateLimits() {
			if !hasRemoteAddress(rl.GetActions()) {
				t.Errorf("route %v: a descriptor without remote_address", r.GetMatch())
			}
			for _, a := range rl.GetActions() {
				if h := a.GetRequestHeaders(); h != nil {
					keys = append(keys, h.GetDescriptorKey())
				}
				if g := a.GetGenericKey(); g != nil {
					keys = append(keys, g.GetDescriptorKey()+"="+g.GetDescriptorValue())
				}
				if a.GetRemoteAddress() != nil {
					keys = append(keys, "remote_address")
				}
			}
		}
	}
	got := strings.Join(keys, ",")
	if want := "api_key,route=create-order,remote_address,api_key,route=search,remote_address,api_key,route=*,remote_address"; got != want {
		t.Errorf("descriptor entries %s, want %s", got, want)
	}
	f := hcm.GetHttpFilters()[0]
	var rl ratelimitv3.RateLimit
	if err := f.GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatalf("first filter %s: %v, want the rate limit filter", f.GetName(), err)
	}
	if err := rl.ValidateAll(); err != nil {
		t.Fatalf("rate limit filter: %v", err)
	}
	if rl.GetFailureModeDeny() || rl.GetRateLimitService().GetTransportApiVersion().String() != "V3" {
		t.Errorf("rate limit filter %v: want V3 and failure_mode_deny false, as docs/proxies.md says", &rl)
	}
}

func hasRemoteAddress(actions []*routev3.RateLimit_Action) bool {
	for _, a := range actions {
		if a.GetRemoteAddress() != nil {
			return true
		}
	}
	return false
}
