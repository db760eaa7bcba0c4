package node

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/policy/envoyconf"
)

// registerEnvoyAttributes registers --envoy-attributes: the descriptor entries Envoy requests'
// attributes are read from, for the control plane (exemptions, overrides, assignments) and
// the violations and usage of RLS traffic.
func (c *Config) registerEnvoyAttributes(f *pflag.FlagSet) {
	f.StringVar(&c.envoyAttributes, "envoy-attributes", EnvDefault("SLUICE_ENVOY_ATTRIBUTES", ""),
		"descriptor entry keys that Envoy requests' attributes are read from where they are not the attribute's own name, such as user=x-user-id,tenant=org; a domain file's attributes: mapping wins (SLUICE_ENVOY_ATTRIBUTES)")
}

// envoyAttributesOption is the limiter option of --envoy-attributes, or an error naming it.
func (c *Config) envoyAttributesOption() (sluice.Option, error) {
	m, err := envoyconf.ParseAttributeMap(c.envoyAttributes)
	if err != nil {
		return nil, fmt.Errorf("--envoy-attributes (SLUICE_ENVOY_ATTRIBUTES): %w", err)
	}
	return sluice.WithEnvoyAttributes(m), nil
}
