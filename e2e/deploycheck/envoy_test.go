package deploycheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
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
	var keys []string
	for _, r := range hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes() {
		for _, rl := range r.GetRoute().GetRateLimits() {
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
	if want := "api_key,route=create-order,api_key,route=search,remote_address,api_key"; got != want {
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
