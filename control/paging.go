package control

import (
	"context"
	"time"
)

// Page selects one page of a list, in the list's order: the items after the cursor, at most
// Limit of them (0: all). The zero Page is the whole list. Lists by id read AfterID (0: from
// the start); lists by name read AfterName (""); identities read AfterKind and AfterName, the
// (kind, value) of the previous page's last item.
type Page struct {
	AfterID   int64
	AfterKind IdentityKind
	AfterName string
	Limit     int
}

// Pager lists the control store's resources a page at a time (issue 29): each page one
// parameterized query that starts after the cursor, so an item created between two pages
// appears on a later page when its key sorts after the cursor, and none is listed twice.
type Pager interface {
	// PageExemptions returns a page of the active exemptions, by id.
	PageExemptions(ctx context.Context, p Page) ([]Exemption, error)
	// PageIdentities returns a page of the identity assignments of one kind, or of every kind
	// for "", by kind then value.
	PageIdentities(ctx context.Context, kind IdentityKind, p Page) ([]Identity, error)
	// PageRules returns a page of the API rules, by name.
	PageRules(ctx context.Context, p Page) ([]Rule, error)
	// PageTokens returns a page of the admin tokens, by name.
	PageTokens(ctx context.Context, p Page) ([]Token, error)
	// PageDomains returns a page of the Envoy-format domains created through the API, by name.
	PageDomains(ctx context.Context, p Page) ([]Domain, error)
	ViolationPager
}

// ViolationKey is where a page of violation counts starts: after the count of this minute,
// rule and identity key, in the list's order (newest minute first, then rule and identity).
type ViolationKey struct {
	Minute   time.Time
	Rule     string
	Identity string
}

// PagedViolation is a violation count with its key, the cursor of the page after it.
type PagedViolation struct {
	ViolationCount
	Key ViolationKey
}

// ViolationPager lists violation counts a page at a time.
type ViolationPager interface {
	// PageViolations returns the counts f selects after the key (nil: from the newest), newest
	// minute first, at most limit (f.Limit is not read; limit <= 0: DefaultAuditLimit).
	PageViolations(ctx context.Context, f ViolationFilter, after *ViolationKey, limit int) ([]PagedViolation, error)
}
