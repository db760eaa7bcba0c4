package adminclient

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Object is a JSON object with its members in order: bodies the CLI builds from a file and
// flags keep the file's order (the server stores a rule as it is given), and answers print
// in the server's order.
type Object []Member

// Member is one member of an Object.
type Member struct {
	Name  string
	Value json.RawMessage
}

// Set replaces or appends the member name with v as JSON.
func (o *Object) Set(name string, v any) {
	b, err := json.Marshal(v)
	if err != nil { // callers pass strings, integers, booleans, finite floats (bodyFromFlags checks) and slices and maps of strings
		panic(fmt.Sprintf("encode %s: %v", name, err))
	}
	o.SetRaw(name, b)
}

func (o *Object) SetRaw(name string, v json.RawMessage) {
	for i := range *o {
		if (*o)[i].Name == name {
			(*o)[i].Value = v
			return
		}
	}
	*o = append(*o, Member{name, v})
}

// Get returns the value of the member name.
func (o Object) Get(name string) (json.RawMessage, bool) {
	for _, m := range o {
		if m.Name == name {
			return m.Value, true
		}
	}
	return nil, false
}

// MarshalJSON renders the members in order.
func (o Object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		name, _ := json.Marshal(m.Name)
		b.Write(name)
		b.WriteByte(':')
		b.Write(m.Value)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// ParseObject reads a JSON object's members in order.
func ParseObject(raw []byte) (Object, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not a JSON object")
	}
	var o Object
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		o = append(o, Member{k.(string), v})
	}
	return o, nil
}
