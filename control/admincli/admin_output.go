package admincli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/sluicehq/sluice/control/adminclient"
)

// object is a request or answer body with its members in order.
type object = adminclient.Object

type member = adminclient.Member

var parseObject = adminclient.ParseObject

// cellKind says how a column renders its values.
type cellKind int

const (
	cellPlain  cellKind = iota
	cellTime            // an RFC 3339 time, shown in UTC to the second
	cellMillis          // milliseconds, shown as a duration
)

// column is one column of a table: its header and the member it shows.
type column struct {
	header string
	field  string
	kind   cellKind
}

// printList prints the array body[key] as a table of cols, in the server's order.
func printList(w io.Writer, body []byte, key string, cols []column) error {
	var members map[string]json.RawMessage
	var items []map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil {
		return fmt.Errorf("read the answer: %w", err)
	}
	if err := json.Unmarshal(members[key], &items); err != nil {
		return fmt.Errorf("read the answer's %q: %w", key, err)
	}
	rows := make([][]string, 0, len(items)+1)
	head := make([]string, len(cols))
	for i, c := range cols {
		head[i] = c.header
	}
	rows = append(rows, head)
	for _, item := range items {
		row := make([]string, len(cols))
		for i, c := range cols {
			row[i] = cell(item[c.field], c.kind)
		}
		rows = append(rows, row)
	}
	return writeTable(w, rows)
}

// printObject prints an object answer as FIELD VALUE rows in the server's order, then extra
// rows (the ETag, a policy version from the header).
func printObject(w io.Writer, body []byte, extra ...[2]string) error {
	o, err := parseObject(body)
	if err != nil {
		return fmt.Errorf("read the answer: %w", err)
	}
	rows := make([][]string, 0, len(o)+len(extra))
	for _, m := range o {
		v := cell(m.Value, cellPlain)
		if m.Name == "at" || strings.HasSuffix(m.Name, "_at") {
			v = cell(m.Value, cellTime)
		} else if d := cell(m.Value, cellMillis); strings.HasSuffix(m.Name, "_ms") && d != v {
			v += " (" + d + ")"
		}
		rows = append(rows, []string{m.Name, v})
	}
	for _, e := range extra {
		if e[1] == "" {
			continue
		}
		if _, ok := o.Get(e[0]); !ok {
			rows = append(rows, []string{e[0], sanitize(e[1])})
		}
	}
	return writeTable(w, rows)
}

// writeTable aligns rows in columns two spaces apart.
func writeTable(w io.Writer, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// writeRaw prints an answer's body as the server sent it, ending with a newline.
func writeRaw(w io.Writer, body []byte) error {
	if _, err := w.Write(body); err != nil {
		return err
	}
	if len(body) == 0 || body[len(body)-1] != '\n' {
		_, err := io.WriteString(w, "\n")
		return err
	}
	return nil
}

// cell renders a JSON value for a table: "-" for none, strings bare, arrays joined with ",",
// objects as k=v pairs by key.
func cell(raw json.RawMessage, kind cellKind) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "-"
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return sanitize(string(raw))
		}
		if s == "" {
			return "-"
		}
		if kind == cellTime {
			if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
				return t.UTC().Format(time.RFC3339)
			}
		}
		return sanitize(s)
	case '[':
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) != nil {
			return sanitize(string(raw))
		}
		parts := make([]string, len(items))
		for i, it := range items {
			parts[i] = cell(it, cellPlain)
		}
		if len(parts) == 0 {
			return "-"
		}
		return strings.Join(parts, ",")
	case '{':
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) != nil {
			return sanitize(string(raw))
		}
		if len(m) == 0 {
			return "-"
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			v := bytes.TrimSpace(m[k])
			s := cell(v, cellPlain)
			if len(v) > 0 && v[0] == '{' { // nested objects keep their braces: tiers.free={...}
				var c bytes.Buffer
				_ = json.Compact(&c, v)
				s = sanitize(c.String())
			}
			parts[i] = sanitize(k) + "=" + s
		}
		return strings.Join(parts, ",")
	}
	if kind == cellMillis {
		if ms, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
			return (time.Duration(ms) * time.Millisecond).String()
		}
	}
	return sanitize(string(raw))
}

// sanitize keeps a value on its line and in its column: names and reasons are whatever
// somebody typed, and a tab, a newline or a terminal escape in one must not forge rows or
// move the cursor. Such characters print quoted, as Go would write them.
func sanitize(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}
