package adminapi

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/policy"
)

// Paged lists (issue 29): ?limit= is the page size, ?after= a cursor from the previous
// page's "next"; a page with more after it carries "next", the last page none.
const (
	// DefaultPageLimit is a page's size when ?limit= is absent: a list of fewer items answers
	// as it did before paging, whole and without "next".
	DefaultPageLimit = 1000
	// MaxPageLimit is the largest ?limit= of a paged list.
	MaxPageLimit = 10_000
)

// Cursor parts: where in a list a page starts. A list of the policy files' items and the
// control store's has the files' first.
const (
	partFile     = "f"  // the policy files' items, by index
	partFileName = "fn" // the policy files' items, by name (domains)
	partID       = "s"  // the control store's items, by id
	partName     = "n"  // the control store's items, by name
	partIdentity = "i"  // identity assignments, by kind then value
	partMinute   = "v"  // violation counts, newest minute first, then rule and identity key
)

// namedPart reports whether part's key is a name (else an integer).
func namedPart(part string) bool {
	return part == partFileName || part == partName || part == partIdentity || part == partMinute
}

// cursor is where a page starts: after the item of key (an index or id) or name (a name; for
// identities "kind:value") in part. The zero cursor is the first page.
type cursor struct {
	part string
	key  int64
	name string
}

// String encodes c for "next": opaque to clients, base64url of "part:key".
func (c cursor) String() string {
	k := c.name
	if !namedPart(c.part) {
		k = strconv.FormatInt(c.key, 10)
	}
	return base64.RawURLEncoding.EncodeToString([]byte(c.part + ":" + k))
}

// identity splits an identity cursor into its kind and value.
func (c cursor) identity() (control.IdentityKind, string) {
	kind, value, _ := strings.Cut(c.name, ":")
	return control.IdentityKind(kind), value
}

// violationCursor is the cursor after a violation count: its minute (in microseconds),
// rule and identity key, as a JSON array.
func violationCursor(k control.ViolationKey) cursor {
	b, _ := json.Marshal([]any{k.Minute.UnixMicro(), k.Rule, k.Identity}) // a number and strings
	return cursor{part: partMinute, name: string(b)}
}

// violation reads a violation cursor's key.
func (c cursor) violation() (control.ViolationKey, bool) {
	var v []json.RawMessage
	var k control.ViolationKey
	var micros int64
	if json.Unmarshal([]byte(c.name), &v) != nil || len(v) != 3 || json.Unmarshal(v[0], &micros) != nil ||
		json.Unmarshal(v[1], &k.Rule) != nil || json.Unmarshal(v[2], &k.Identity) != nil {
		return k, false
	}
	k.Minute = time.UnixMicro(micros).UTC()
	return k, true
}

// pageParams reads ?limit= (1 to MaxPageLimit, DefaultPageLimit when absent) and ?after= (a
// cursor this server gave; parts lists the parts the list has).
func pageParams(q url.Values, parts ...string) (int, cursor, error) {
	limit := DefaultPageLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxPageLimit {
			return 0, cursor{}, &policy.FieldError{Field: "limit", Msg: fmt.Sprintf("must be an integer from 1 to %d", MaxPageLimit)}
		}
		limit = n
	}
	v := q.Get("after")
	if v == "" {
		return limit, cursor{}, nil
	}
	bad := &policy.FieldError{Field: "after", Msg: "not a cursor of this list: pass the previous page's next as it is"}
	raw, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil {
		return 0, cursor{}, bad
	}
	part, key, ok := strings.Cut(string(raw), ":")
	if !ok {
		return 0, cursor{}, bad
	}
	known := false
	for _, p := range parts {
		known = known || p == part
	}
	if !known {
		return 0, cursor{}, bad
	}
	c := cursor{part: part, name: key}
	switch {
	case part == partIdentity:
		if kind, _, ok := strings.Cut(key, ":"); !ok || !validKind(control.IdentityKind(kind)) {
			return 0, cursor{}, bad
		}
	case part == partMinute:
		if _, ok := c.violation(); !ok {
			return 0, cursor{}, bad
		}
	case namedPart(part):
		if key == "" {
			return 0, cursor{}, bad
		}
	default:
		n, err := strconv.ParseInt(key, 10, 64)
		if err != nil || n < 0 {
			return 0, cursor{}, bad
		}
		c = cursor{part: part, key: n}
	}
	return limit, c, nil
}

// validKind reports whether kind is an identity kind.
func validKind(kind control.IdentityKind) bool {
	switch kind {
	case control.IdentityAPIKey, control.IdentityUser, control.IdentityTenant:
		return true
	}
	return false
}

// pager builds one page of a list: each list adds its items in order with their cursors until
// full; it holds one item more than the page, which tells whether a next page exists.
type pager struct {
	limit int
	after cursor
	items []any
	keys  []cursor
}

// newPager reads a list's ?limit= and ?after= (see pageParams).
func newPager(q url.Values, parts ...string) (*pager, error) {
	limit, after, err := pageParams(q, parts...)
	if err != nil {
		return nil, err
	}
	return &pager{limit: limit, after: after}, nil
}

// full reports whether the page (and the one item that tells of a next) is complete.
func (p *pager) full() bool { return len(p.items) > p.limit }

// room is how many more items the page takes: the store query's limit.
func (p *pager) room() int { return p.limit + 1 - len(p.items) }

// add appends an item and the cursor that starts after it.
func (p *pager) add(item any, c cursor) {
	p.items = append(p.items, item)
	p.keys = append(p.keys, c)
}

// reads reports whether the page still reads a part that comes before each of later (the
// parts after it in the list's order): not when the cursor is in one of them, nor when full.
func (p *pager) reads(later ...string) bool {
	for _, l := range later {
		if p.after.part == l {
			return false
		}
	}
	return !p.full()
}

// answer writes the page as {name: [items], "next": cursor} ("next" only when more follow).
func (p *pager) answer(w http.ResponseWriter, name string) error {
	items := p.items
	var next *cursor
	if len(items) > p.limit {
		items, next = items[:p.limit], &p.keys[p.limit-1]
	}
	return answer(w, http.StatusOK, "", pageAnswer(name, items, next))
}

// pageAnswer is the body of a paged list: the items under name, and next when more follow.
func pageAnswer(name string, items []any, next *cursor) map[string]any {
	if items == nil {
		items = []any{}
	}
	out := map[string]any{name: items}
	if next != nil {
		out["next"] = next.String()
	}
	return out
}
