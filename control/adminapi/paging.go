package adminapi

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"strconv"
	"strings"

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

// cursor is where a page starts: after the item of key in part ("f", the policy files'
// items by index; "s", the control store's by id). The zero cursor is the first page.
type cursor struct {
	part string
	key  int64
}

// String encodes c for "next": opaque to clients, base64url of "part:key".
func (c cursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(c.part + ":" + strconv.FormatInt(c.key, 10)))
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
	n, err := strconv.ParseInt(key, 10, 64)
	if err != nil || n < 0 {
		return 0, cursor{}, bad
	}
	for _, p := range parts {
		if p == part {
			return limit, cursor{part: part, key: n}, nil
		}
	}
	return 0, cursor{}, bad
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
