package sqlstore

import (
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"
)

// nameLine marks the start of a query in a .sql file, as sqlc writes it.
var nameLine = regexp.MustCompile(`^--\s*name:\s*(\w+)`)

// ParseQueries reads every .sql file in dir of fsys and returns its queries by name. A query
// starts at a "-- name: Name" line and runs to the next one or the end of the file; a trailing
// semicolon is dropped. Duplicate names are an error. Hand-written rather than sqlc-generated:
// the core issues each query through database/sql for both databases, so sqlc's typed Go per
// engine would be two copies of what this file's 40 lines and store.go's scanners do once.
func ParseQueries(fsys fs.FS, dir string) (map[string]string, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read queries %s: %w", dir, err)
	}
	queries := map[string]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		file := path.Join(dir, e.Name())
		data, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, fmt.Errorf("read queries %s: %w", file, err)
		}
		var name string
		var body []string
		flush := func() error {
			if name == "" {
				return nil
			}
			q := strings.TrimSuffix(strings.TrimSpace(strings.Join(body, "\n")), ";")
			if _, dup := queries[name]; dup {
				return fmt.Errorf("%s: query %s defined twice", file, name)
			}
			if q == "" {
				return fmt.Errorf("%s: query %s is empty", file, name)
			}
			queries[name] = q
			return nil
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			if m := nameLine.FindStringSubmatch(line); m != nil {
				if err := flush(); err != nil {
					return nil, err
				}
				name, body = m[1], nil
				continue
			}
			if name != "" {
				body = append(body, line)
			}
		}
		if err := flush(); err != nil {
			return nil, err
		}
	}
	return queries, nil
}

// Names returns the names of queries, sorted; for tests that compare drivers.
func Names(queries map[string]string) []string {
	names := make([]string, 0, len(queries))
	for n := range queries {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
