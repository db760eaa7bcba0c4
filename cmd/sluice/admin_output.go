package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
)

// object is a JSON object with its members in order: bodies the CLI builds from a file and
// flags keep the file's order (the server stores a rule as it is given), and answers print
// in the server's order.
type object []member

type member struct {
	name  string
	value json.RawMessage
}

// set replaces or appends the member name with v as JSON.
func (o *object) set(name string, v any) {
	b, err := json.Marshal(v)
	if err != nil { // callers pass strings, integers, booleans, finite floats (bodyFromFlags checks) and slices and maps of strings
		panic(fmt.Sprintf("encode %s: %v", name, err))
	}
	o.setRaw(name, b)
}

func (o *object) setRaw(name string, v json.RawMessage) {
	for i := range *o {
		if (*o)[i].name == name {
			(*o)[i].value = v
			return
		}
	}
	*o = append(*o, member{name, v})
}

// get returns the value of the member name.
func (o object) get(name string) (json.RawMessage, bool) {
	for _, m := range o {
		if m.name == name {
			return m.value, true
		}
	}
	return nil, false
}

// MarshalJSON renders the members in order.
func (o object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		name, _ := json.Marshal(m.name)
		b.Write(name)
		b.WriteByte(':')
		b.Write(m.value)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// parseObject reads a JSON object's members in order.
func parseObject(raw []byte) (object, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not a JSON object")
	}
	var o object
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		o = append(o, member{k.(string), v})
	}
	return o, nil
}

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
		v := cell(m.value, cellPlain)
		if m.name == "at" || strings.HasSuffix(m.name, "_at") {
			v = cell(m.value, cellTime)
		} else if d := cell(m.value, cellMillis); strings.HasSuffix(m.name, "_ms") && d != v {
			v += " (" + d + ")"
		}
		rows = append(rows, []string{m.name, v})
	}
	for _, e := range extra {
		if e[1] == "" {
			continue
		}
		if _, ok := o.get(e[0]); !ok {
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
