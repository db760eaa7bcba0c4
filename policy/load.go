package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/policy/envoyconf"
)

// Load reads the policy at path: one YAML file, or every *.yaml and *.yml file of a directory
// (not recursive). A file whose top level has `domain` is in the format of Envoy's reference
// rate limit service; any other is native. The snapshot's version is a hash of the files'
// names and contents, so the same files always give the same version.
func Load(path string) (*Snapshot, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("load policy: %w", err)
	}
	names := []string{path}
	if info.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, fmt.Errorf("load policy %s: %w", path, err)
		}
		names = names[:0]
		for _, e := range entries {
			if n := e.Name(); !e.IsDir() && !strings.HasPrefix(n, ".") && (strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
				names = append(names, filepath.Join(path, n))
			}
		}
	}
	files := make(map[string][]byte, len(names))
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("load policy: %w", err)
		}
		files[n] = data
	}
	return LoadFiles(files)
}

// LoadFiles is Load for named in-memory files.
func LoadFiles(files map[string][]byte) (*Snapshot, error) {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	var native []*Config
	envoy := map[string][]byte{}
	h := sha256.New()
	for _, n := range names {
		data := files[n]
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(data))
		h.Write(data)
		if isEnvoyFormat(data) {
			envoy[n] = data
			continue
		}
		cfg, err := ParseConfig(n, data)
		if err != nil {
			return nil, err
		}
		native = append(native, cfg)
	}
	snap, err := Compile(native...)
	if err != nil {
		return nil, err
	}
	version := hex.EncodeToString(h.Sum(nil)[:6])
	if len(envoy) == 0 {
		snap.Version = version
		return snap, nil
	}
	cfg, err := envoyconf.Load(envoy, false)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return snap.WithEnvoy(cfg, version), nil
}

// isEnvoyFormat reports whether a YAML document's top level has a `domain` key. A document that
// does not parse is left to the native parser, which reports the error with its line.
func isEnvoyFormat(data []byte) bool {
	var top map[string]yaml.Node
	if err := yaml.Unmarshal(data, &top); err != nil {
		return false
	}
	_, ok := top["domain"]
	return ok
}
