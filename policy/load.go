package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
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
// contents (see LoadFiles), so the same files give the same version however path is spelled.
func Load(path string) (*Snapshot, error) {
	f, err := ReadFiles(path)
	if err != nil {
		return nil, err
	}
	return f.snap, nil
}

// ReadFiles reads and validates the policy files at path as Load does, and keeps them parsed
// for CompileWith, which combines them with the control store's state.
func ReadFiles(path string) (*Files, error) {
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
	return ParseFiles(files)
}

// LoadFiles is Load for named in-memory files. Files are read in the order of their names.
// It reports every mistake of every file, each a *FieldError (file:line: field: message),
// joined with errors.Join and in file and line order.
//
// The version is a hash of the contents alone, in that order: not of the names, which depend
// on how a path was spelled (./p.yaml, p.yaml, /etc/sluice/p.yaml) and on where each node
// mounts its files, so that nodes given the same policy report the same version and can be
// compared. The order is kept because it is part of the policy: rules apply in it, and
// Envoy-format wildcards of a merged domain are tried in it.
func LoadFiles(files map[string][]byte) (*Snapshot, error) {
	f, err := ParseFiles(files)
	if err != nil {
		return nil, err
	}
	return f.snap, nil
}

// Files is a policy read from files, parsed and validated: the read-only part of a policy,
// which CompileWith combines with the control store's state. It is immutable.
type Files struct {
	// Version is the hash of the files' contents that LoadFiles describes.
	Version string

	native []*Config
	envoy  *envoyconf.Config
	snap   *Snapshot // the files alone
}

// Snapshot returns the policy of the files alone, whose version is Files.Version.
func (f *Files) Snapshot() *Snapshot { return f.snap }

// Configs returns the native files as parsed, for read-only views of their entries (the admin
// API lists file rules, overrides and exemptions with source "file"). Do not modify them.
func (f *Files) Configs() []*Config { return f.native }

// Envoy returns the files' Envoy-format configuration, nil when they have none.
func (f *Files) Envoy() *envoyconf.Config { return f.envoy }

// ParseFiles is LoadFiles that keeps the files parsed for CompileWith. It refuses files with
// any mistake, as LoadFiles does.
func ParseFiles(files map[string][]byte) (*Files, error) {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	var native []*Config
	var errs errorList
	envoy := map[string][]byte{}
	h := sha256.New()
	for _, n := range names {
		data := files[n]
		fmt.Fprintf(h, "%d\x00", len(data))
		h.Write(data)
		if isEnvoyFormat(data) {
			envoy[n] = data
			continue
		}
		cfg, perrs := parseConfig(n, data)
		for _, err := range perrs {
			errs.add(err)
		}
		if cfg != nil {
			native = append(native, cfg)
		}
	}
	var cfg *envoyconf.Config
	if len(envoy) > 0 {
		var err error
		if cfg, err = envoyconf.Load(envoy, false); err != nil {
			for _, e := range unjoin(err) {
				var le *envoyconf.LoadError
				if errors.As(e, &le) {
					e = &FieldError{File: le.File, Line: le.Line, Field: le.Field, Msg: le.Msg}
				}
				errs.add(e)
			}
		}
	}
	snap := compile(native, cfg, &errs)
	if err := errs.err(); err != nil {
		return nil, err
	}
	version := hex.EncodeToString(h.Sum(nil)[:6])
	snap.Version, snap.filesVersion, snap.envoy = version, version, cfg
	return &Files{Version: version, native: native, envoy: cfg, snap: snap}, nil
}

// unjoin returns the errors that errors.Join joined into err, or err alone.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
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
