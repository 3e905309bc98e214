package main

import (
	"bytes"
	"os"

	"github.com/goccy/go-yaml"
)

// gatewayRoutes is the set of route ids the gateway config files at paths define, or nil
// when no file is given (no check). Only routes[].id is read, leniently: the gateway
// validates its own files (gateway --check).
func gatewayRoutes(paths []string) (routes map[string]bool, err error) {
	if len(paths) == 0 {
		return nil, nil
	}
	routes = map[string]bool{}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, usagef("--gateway-config %s: %v", p, err)
		}
		var cfg struct {
			Routes []struct {
				ID string `yaml:"id"`
			} `yaml:"routes"`
		}
		if err := decodeLenient(data, &cfg); err != nil {
			return nil, usagef("--gateway-config %s: not a gateway config: %v", p, err)
		}
		if len(cfg.Routes) == 0 {
			return nil, usagef("--gateway-config %s: defines no routes", p)
		}
		for _, r := range cfg.Routes {
			routes[r.ID] = true
		}
	}
	return routes, nil
}

func decodeLenient(data []byte, v any) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = errNotYAML
		}
	}()
	return yaml.NewDecoder(bytes.NewReader(data)).Decode(v)
}

type notYAML struct{}

func (notYAML) Error() string { return "not valid YAML" }

var errNotYAML error = notYAML{}
