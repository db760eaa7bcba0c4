package node

import (
	_ "embed" // the built-in policy
	"fmt"

	"github.com/sluicehq/sluice/policy"
)

// DefaultPolicy is the built-in policy a node runs without --config (sluice config show).
//
//go:embed default-policy.yaml
var DefaultPolicy []byte

// Describe summarises a snapshot for logs and `sluice config validate`.
func Describe(s *policy.Snapshot) string {
	domains := 0
	if e := s.Envoy(); e != nil {
		domains = len(e.Domains())
	}
	return fmt.Sprintf("%s, %s, version %s", count(len(s.Rules()), "rule", "rules"), count(domains, "Envoy domain", "Envoy domains"), s.Version)
}

// count writes n with the noun's singular or plural: "1 rule", "0 rules".
func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// loadFiles reads the policy files at path, or the built-in policy when path is empty.
func loadFiles(path string, opts ...policy.LoadOption) (*policy.Files, error) {
	if path == "" {
		return policy.ParseFiles(map[string][]byte{"built-in default-policy.yaml": DefaultPolicy}, opts...)
	}
	return policy.ReadFiles(path, opts...)
}
