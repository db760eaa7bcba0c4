package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"unicode/utf8"
)

// Request holds the attributes of one request to rate-limit (docs/architecture.md, Request attributes).
type Request struct {
	Tenant   string `json:"tenant,omitempty"`
	User     string `json:"user,omitempty"`
	APIKey   string `json:"api_key,omitempty"`
	IP       string `json:"ip,omitempty"`
	Endpoint string `json:"endpoint,omitempty"`
	Method   string `json:"method,omitempty"`
	Tier     string `json:"tier,omitempty"`
	// Descriptors are free-form attributes that rules can match and key on.
	Descriptors map[string]string `json:"descriptors,omitempty"`
	// Cost is what the request consumes from each of its limits. The zero value means 1; to
	// look without consuming, use the limiter's Quota.
	Cost int64 `json:"cost,omitempty"`
	// IdempotencyKey, when set, makes a retry of the same request inside the key's TTL return
	// the first decision and consume nothing again. Only an allowed decision is remembered, and
	// only for the same request: the key with another cost or other limits is refused
	// (sluice.ErrIdempotencyMismatch).
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// Bounds on request attributes. Keys hash long values anyway; these bounds keep hostile input
// from costing memory and CPU before it is rejected.
const (
	MaxAttribute   = 1024
	MaxDescriptors = 32
	MaxCost        = 1 << 30
)

// ErrInvalid is wrapped by every error that reports bad input: a request field or a policy
// field. Servers answer it with 400 or InvalidArgument.
var ErrInvalid = errors.New("invalid argument")

// FieldError names the input field that is wrong and why. File and Line locate policy errors.
type FieldError struct {
	File  string
	Line  int
	Field string
	Msg   string

	// ifGiven replaces Msg when the source shows the field was written: a decoded 0 is also
	// what a missing field reads as, and "required" misleads someone who wrote limit: 0.
	ifGiven string
}

// given switches e to its message for a value that was written, if it has one.
func (e *FieldError) given() {
	if e.ifGiven != "" {
		e.Msg, e.ifGiven = e.ifGiven, ""
	}
}

func (e *FieldError) Error() string {
	switch {
	case e.File != "" && e.Line > 0:
		return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, e.Field, e.Msg)
	case e.File != "":
		return fmt.Sprintf("%s: %s: %s", e.File, e.Field, e.Msg)
	case e.Line > 0:
		return fmt.Sprintf("line %d: %s: %s", e.Line, e.Field, e.Msg)
	}
	return e.Field + ": " + e.Msg
}

// Unwrap makes every FieldError match ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// Identity is the attribute that identifies the caller: api_key, else user, else ip. kind is
// 'a', 'u' or 'i', or 0 when the request has none.
func (r *Request) Identity() (kind byte, value string) {
	switch {
	case r.APIKey != "":
		return 'a', r.APIKey
	case r.User != "":
		return 'u', r.User
	case r.IP != "":
		return 'i', r.IP
	}
	return 0, ""
}

// Validate checks the request's bounds: cost, attribute lengths, UTF-8 and the IP's form. It
// also rewrites IP in its canonical form, so that every spelling of one address is one caller.
func (r *Request) Validate() error {
	// Most requests are short ASCII identifiers with no descriptors and no IP to parse: one
	// pass over each field says so, and only a request that fails it is examined field by field.
	if r.Cost >= 0 && r.Cost <= MaxCost && r.IP == "" && len(r.Descriptors) == 0 &&
		plain(r.Tenant) && plain(r.User) && plain(r.APIKey) && plain(r.Endpoint) &&
		plain(r.Method) && plain(r.Tier) && plain(r.IdempotencyKey) {
		return nil
	}
	return r.validateFields()
}

// plain reports whether v is within MaxAttribute bytes and ASCII, which is valid UTF-8.
func plain(v string) bool { return len(v) <= MaxAttribute && isASCII(v) }

func (r *Request) validateFields() error {
	if r.Cost < 0 {
		return &FieldError{Field: "cost", Msg: "must be >= 0"}
	}
	if r.Cost > MaxCost {
		return &FieldError{Field: "cost", Msg: fmt.Sprintf("must be <= %d", MaxCost)}
	}
	for i, v := range [...]string{r.Tenant, r.User, r.APIKey, r.IP, r.Endpoint, r.Method, r.Tier, r.IdempotencyKey} {
		if v != "" {
			if err := checkAttribute(attributeNames[i], v); err != nil {
				return err
			}
		}
	}
	if len(r.Descriptors) > MaxDescriptors {
		return &FieldError{Field: "descriptors", Msg: fmt.Sprintf("at most %d entries", MaxDescriptors)}
	}
	for k, v := range r.Descriptors {
		if k == "" {
			return &FieldError{Field: "descriptors", Msg: "empty key"}
		}
		if err := checkAttribute("descriptors key", k); err != nil {
			return err
		}
		if err := checkAttribute("descriptors."+k, v); err != nil {
			return err
		}
	}
	if r.IP != "" {
		addr, err := netip.ParseAddr(r.IP)
		if err != nil {
			return &FieldError{Field: "ip", Msg: fmt.Sprintf("%q is not an IP address", r.IP)}
		}
		// One address is one bucket however it is written (::ffff:192.0.2.7 is 192.0.2.7,
		// 2001:0DB8::1 is 2001:db8::1): a caller who picks the spelling must not pick a fresh
		// bucket. The canonical form replaces the given one, allocating only when they differ.
		var buf [64]byte
		if canonical := addr.Unmap().AppendTo(buf[:0]); string(canonical) != r.IP {
			r.IP = string(canonical)
		}
	}
	return nil
}

var attributeNames = [...]string{"tenant", "user", "api_key", "ip", "endpoint", "method", "tier", "idempotency_key"}

func checkAttribute(name, v string) error {
	if len(v) > MaxAttribute {
		return &FieldError{Field: name, Msg: fmt.Sprintf("longer than %d bytes", MaxAttribute)}
	}
	if !isASCII(v) && !utf8.ValidString(v) {
		return &FieldError{Field: name, Msg: "not valid UTF-8"}
	}
	return nil
}

// isASCII is the fast path of UTF-8 validation for the identifiers most requests carry.
func isASCII(s string) bool {
	var seen byte // OR of every byte: no branch per byte
	for i := 0; i < len(s); i++ {
		seen |= s[i]
	}
	return seen < utf8.RuneSelf
}
