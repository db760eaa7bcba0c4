package xds

import (
	"fmt"
	"strings"

	rlsconfpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// DocumentPrefix starts the name of every document Documents returns: the policy's errors
// name a document, so that an error reads xds:NAME:LINE: field: message.
const DocumentPrefix = "xds:"

// Documents turns the resources of one response into documents in the reference service's
// YAML format, named DocumentPrefix + the resource's name, as the reference turns each
// RateLimitConfig into its YAML form before loading it. A resource of another type, one that
// does not decode, or two of one name are errors naming the resource.
func Documents(resources []*anypb.Any) (map[string][]byte, error) {
	docs := make(map[string][]byte, len(resources))
	for i, res := range resources {
		var cfg rlsconfpb.RateLimitConfig
		if res.GetTypeUrl() != TypeURL {
			return nil, fmt.Errorf("resources[%d]: type %q is not %s", i, res.GetTypeUrl(), TypeURL)
		}
		if err := res.UnmarshalTo(&cfg); err != nil {
			return nil, fmt.Errorf("resources[%d]: %w", i, err)
		}
		name := cfg.GetName()
		if name == "" {
			name = cfg.GetDomain()
		}
		if name == "" {
			return nil, fmt.Errorf("resources[%d]: name: missing (and no domain)", i)
		}
		key := DocumentPrefix + name
		if _, dup := docs[key]; dup {
			return nil, fmt.Errorf("resources[%d]: name: %q is given twice", i, name)
		}
		data, err := YAML(&cfg)
		if err != nil {
			return nil, fmt.Errorf("resources[%d] %q: %w", i, name, err)
		}
		docs[key] = data
	}
	return docs, nil
}

// The reference's YAML form, field for field: omitted fields are left out rather than written
// as zeros, so that the loader tells a missing field from a zero one as it does for files.
type (
	yamlConfig struct {
		Domain      string           `yaml:"domain"`
		Descriptors []yamlDescriptor `yaml:"descriptors,omitempty"`
	}
	yamlDescriptor struct {
		Key            string           `yaml:"key"`
		Value          string           `yaml:"value,omitempty"`
		RateLimit      *yamlRateLimit   `yaml:"rate_limit,omitempty"`
		Descriptors    []yamlDescriptor `yaml:"descriptors,omitempty"`
		ShadowMode     bool             `yaml:"shadow_mode,omitempty"`
		DetailedMetric bool             `yaml:"detailed_metric,omitempty"`
	}
	yamlRateLimit struct {
		Unit            string        `yaml:"unit,omitempty"`
		RequestsPerUnit *uint32       `yaml:"requests_per_unit,omitempty"`
		Unlimited       bool          `yaml:"unlimited,omitempty"`
		Name            string        `yaml:"name,omitempty"`
		Replaces        []yamlReplace `yaml:"replaces,omitempty"`
	}
	yamlReplace struct {
		Name string `yaml:"name"`
	}
)

// YAML writes one RateLimitConfig in the reference's YAML format. A unit of UNKNOWN (the
// proto's zero) is left out, so that the loader reports it missing unless the limit is
// unlimited; requests_per_unit is left out of an unlimited limit.
func YAML(cfg *rlsconfpb.RateLimitConfig) ([]byte, error) {
	out := yamlConfig{Domain: cfg.GetDomain(), Descriptors: descriptors(cfg.GetDescriptors())}
	data, err := yaml.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("write YAML: %w", err)
	}
	return data, nil
}

func descriptors(in []*rlsconfpb.RateLimitDescriptor) []yamlDescriptor {
	if len(in) == 0 {
		return nil
	}
	out := make([]yamlDescriptor, len(in))
	for i, d := range in {
		out[i] = yamlDescriptor{
			Key: d.GetKey(), Value: d.GetValue(),
			Descriptors: descriptors(d.GetDescriptors()),
			ShadowMode:  d.GetShadowMode(), DetailedMetric: d.GetDetailedMetric(),
		}
		if rl := d.GetRateLimit(); rl != nil {
			y := &yamlRateLimit{Unlimited: rl.GetUnlimited(), Name: rl.GetName()}
			if u := rl.GetUnit(); u != rlsconfpb.RateLimitUnit_UNKNOWN {
				y.Unit = strings.ToLower(u.String())
			}
			if !rl.GetUnlimited() {
				n := rl.GetRequestsPerUnit()
				y.RequestsPerUnit = &n
			}
			for _, r := range rl.GetReplaces() {
				y.Replaces = append(y.Replaces, yamlReplace{Name: r.GetName()})
			}
			out[i].RateLimit = y
		}
	}
	return out
}
