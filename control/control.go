// Package control is the control plane's database: API rules, overrides, exemptions, identity
// assignments, admin tokens, the audit log and node heartbeats (docs/architecture.md, Control plane).
//
// Store is the one interface the rest of Sluice uses; control/sqlite (embedded, one node) and
// control/postgres (a fleet) implement it with the same semantics, checked by the shared suite
// in control/controltest. This package imports no driver and nothing of policy: the compile
// step reads a State and builds the policy snapshot, so the hot path never touches a Store.
//
// Every change is one transaction that writes the change, its audit event and a new control
// version together; a change that fails writes nothing. Strings (names, identities, reasons)
// are hostile data: they reach the database only as query parameters and come back verbatim.
package control

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"
)

// Errors callers branch on; the drivers wrap them with context, so test with errors.Is.
var (
	// ErrNotFound: no resource has that name, id or key.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the resource exists already (a rule or token name, an override's or an
	// exemption's target, a token hash).
	ErrConflict = errors.New("conflict")
	// ErrPreconditionFailed: Change.IfMatch did not match the resource's current ETag, or the
	// resource does not exist while IfMatch was given.
	ErrPreconditionFailed = errors.New("precondition failed")
	// ErrInvalid: a value breaks the store's own constraints; the error is an *InvalidError
	// naming the field. Callers validate first; this is the backstop.
	ErrInvalid = errors.New("invalid")

	// ErrLastAdmin is returned for a deletion of the last admin token, which would leave
	// nobody able to create tokens until a restart with a new bootstrap secret. It wraps
	// ErrConflict.
	ErrLastAdmin = fmt.Errorf("%w: the last admin token", ErrConflict)
)

// InvalidError is a value the store refuses, named by its JSON field.
type InvalidError struct {
	Field string
	Msg   string
}

// Error returns "field: message".
func (e *InvalidError) Error() string { return e.Field + ": " + e.Msg }

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

// Store is the control store. Its methods are safe for concurrent use. Reads return ErrNotFound
// for a missing resource; writes take a Change (who, why, and an optional If-Match) and return
// the resource as written, whose Version is the control version that includes the change.
//
// Times are the store's clock (Options.Now), in UTC, truncated to microseconds.
type Store interface {
	Pager
	// ListRules returns every API rule, by name.
	ListRules(ctx context.Context) ([]Rule, error)
	// GetRule returns the rule called name.
	GetRule(ctx context.Context, name string) (Rule, error)
	// CreateRule stores a new rule. body is the rule as native JSON, already validated by the
	// caller; the store checks only that it is a JSON object. ErrConflict if name is taken.
	CreateRule(ctx context.Context, ch Change, name string, body json.RawMessage) (Rule, error)
	// UpdateRule replaces the body of an existing rule. ErrNotFound if it does not exist
	// (ErrPreconditionFailed if ch.IfMatch was given).
	UpdateRule(ctx context.Context, ch Change, name string, body json.RawMessage) (Rule, error)
	// DeleteRule deletes a rule and returns the control version of the change.
	DeleteRule(ctx context.Context, ch Change, name string) (int64, error)

	// ListOverrides returns the active overrides (not yet expired by the store's clock) that
	// match f, by id.
	ListOverrides(ctx context.Context, f OverrideFilter) ([]Override, error)
	// GetOverride returns an override, expired or not, until Expire deletes it.
	GetOverride(ctx context.Context, id int64) (Override, error)
	// CreateOverride stores o and assigns its ID, CreatedBy (ch.Actor) and CreatedAt.
	// o.ExpiresAt must be in the future. ErrConflict if an active override has the same target
	// (tenant, user, api_key, endpoint, rule); an expired one is expired in the same transaction.
	// With ch.IfMatch, o replaces the active override of its target if that one's ETag matches
	// ("*": any), in one change audited once (before: the old, after: o); ErrPreconditionFailed
	// if it does not match or there is none. Escalation turns a warning into a ban so.
	CreateOverride(ctx context.Context, ch Change, o Override) (Override, error)
	// DeleteOverride deletes an override and returns the control version of the change.
	DeleteOverride(ctx context.Context, ch Change, id int64) (int64, error)
	// UpdateOverride gives the override o.ID the ExpiresAt, Value, Limit, Burst and Reason of
	// o, in one transaction audited as an update (before and after); its target, type, source
	// and creation stay. o.ExpiresAt must be in the future. ErrNotFound when there is no such
	// override (ErrPreconditionFailed with ch.IfMatch); ErrPreconditionFailed when ch.IfMatch
	// does not match. Extending a ban so never lifts it in between, as a delete and a create
	// would.
	UpdateOverride(ctx context.Context, ch Change, o Override) (Override, error)

	// ListExemptions returns the active exemptions, by id.
	ListExemptions(ctx context.Context) ([]Exemption, error)
	// GetExemption returns an exemption, expired or not, until Expire deletes it.
	GetExemption(ctx context.Context, id int64) (Exemption, error)
	// CreateExemption stores e and assigns its ID, CreatedBy and CreatedAt. ErrConflict if an
	// active exemption names the same caller.
	CreateExemption(ctx context.Context, ch Change, e Exemption) (Exemption, error)
	// DeleteExemption deletes an exemption and returns the control version of the change.
	DeleteExemption(ctx context.Context, ch Change, id int64) (int64, error)
	// UpdateExemption gives the exemption e.ID the ExpiresAt (nil: never) and Reason of e, in
	// one transaction audited as an update; errors as UpdateOverride's.
	UpdateExemption(ctx context.Context, ch Change, e Exemption) (Exemption, error)

	// ListIdentities returns the identity assignments of one kind, or of every kind for "",
	// by kind and value.
	ListIdentities(ctx context.Context, kind IdentityKind) ([]Identity, error)
	// GetIdentity returns the assignment of (kind, value).
	GetIdentity(ctx context.Context, kind IdentityKind, value string) (Identity, error)
	// PutIdentity creates or replaces the assignment of (id.Kind, id.Value); created tells which.
	PutIdentity(ctx context.Context, ch Change, id Identity) (_ Identity, created bool, _ error)
	// DeleteIdentity deletes an assignment and returns the control version of the change.
	DeleteIdentity(ctx context.Context, ch Change, kind IdentityKind, value string) (int64, error)

	// ListDomains returns every Envoy-format domain created through the API, by name.
	ListDomains(ctx context.Context) ([]Domain, error)
	// GetDomain returns the domain called name.
	GetDomain(ctx context.Context, name string) (Domain, error)
	// PutDomain creates or replaces the domain called name; body is its configuration in the
	// reference service's format as a JSON object, already validated by the caller (the
	// store checks only that it is a JSON object). created tells which it did.
	PutDomain(ctx context.Context, ch Change, name string, body json.RawMessage) (_ Domain, created bool, _ error)
	// DeleteDomain deletes a domain and returns the control version of the change.
	DeleteDomain(ctx context.Context, ch Change, name string) (int64, error)

	// ListTokens returns every admin token (names and roles; hashes are never secrets), by name.
	ListTokens(ctx context.Context) ([]Token, error)
	// GetToken returns the token called name.
	GetToken(ctx context.Context, name string) (Token, error)
	// TokenByHash returns the token whose secret hashes to h (see HashToken). The lookup is an
	// index match on the hash, so it reveals nothing about the secret through timing.
	TokenByHash(ctx context.Context, h TokenHash) (Token, error)
	// CreateToken stores t. ErrConflict if the name or the hash is taken.
	CreateToken(ctx context.Context, ch Change, t Token) (Token, error)
	// DeleteToken deletes a token and returns the control version of the change.
	// ErrLastAdmin for the last admin token.
	DeleteToken(ctx context.Context, ch Change, name string) (int64, error)
	// TokenRevoked reports whether a token whose secret hashes to h was deleted (revoked):
	// DeleteToken keeps the hashes, so a revoked bootstrap secret is not recreated at a start.
	TokenRevoked(ctx context.Context, h TokenHash) (bool, error)
	// TokenUsed records that the token called name authenticated at at; it only moves the
	// last-used time forward. It is not a change: no control version, no audit event. Callers
	// batch it off the request path (the admin API: at most once a minute per token).
	TokenUsed(ctx context.Context, name string, at time.Time) error
	// ReplaceToken stores t in place of the token of its name, in one transaction (audited
	// as an update), or creates it when there is none: a rotated secret never leaves a moment
	// without the token. ErrConflict if the hash is another token's.
	ReplaceToken(ctx context.Context, ch Change, t Token) (Token, error)

	// AppendAudit records an event that is not a change of this store: a policy-file reload or
	// an automatic penalty. It sets ID and At and leaves Version 0; it bumps no version.
	AppendAudit(ctx context.Context, e AuditEvent) (AuditEvent, error)
	// Audit returns the events that match f, newest first.
	Audit(ctx context.Context, f AuditFilter) ([]AuditEvent, error)
	// PruneAudit deletes the events recorded before t and returns how many (retention).
	PruneAudit(ctx context.Context, before time.Time) (int64, error)

	// Version returns the control version: it grows by one with every change, in the change's
	// transaction, so equal versions mean equal contents.
	Version(ctx context.Context) (int64, error)
	// Watch returns a channel that receives the control version after changes made through
	// any Store on the same database (PostgreSQL: any node; SQLite: any Store of this process).
	// Values coalesce: a slow reader gets the latest version, never a backlog, and the sender
	// never blocks. The channel is closed when ctx is done or the Store is closed. Delivery is
	// best effort (a lost PostgreSQL connection drops notifications until it is back, and then
	// sends the current version): poll Version too.
	Watch(ctx context.Context) <-chan int64
	// Load reads everything the compile step needs in one consistent snapshot. It reports
	// its progress to ReportProgress(ctx) as it reads.
	Load(ctx context.Context) (*State, error)
	// Expire deletes the overrides and exemptions whose expiry has passed by the store's clock,
	// auditing each with action "expire" and actor ActorSystem, in one transaction. It returns
	// how many it deleted and the control version of the change (0 when there was nothing).
	Expire(ctx context.Context) (n int, version int64, _ error)

	// Heartbeat records that node n is alive now (SeenAt is set by the store).
	Heartbeat(ctx context.Context, n Node) error
	// Nodes returns the nodes seen at or after since, by id.
	Nodes(ctx context.Context, since time.Time) ([]Node, error)
	// PruneNodes forgets the nodes last seen before t and returns how many.
	PruneNodes(ctx context.Context, before time.Time) (int64, error)

	// AddCounts adds one node's per-minute decision counts to the fleet's, in one transaction:
	// counts for a (minute, rule, tenant) or (minute, rule, identity) already stored are
	// increased, so every node's flushes add up; rows given twice add up too. Minutes are
	// truncated to the minute.
	AddCounts(ctx context.Context, usage []UsageCount, violations []ViolationCount) error
	// UsageHistory sums the usage counts that match f per step, oldest first; steps without
	// counts are left out. Without f.Rule it sums the per-decision counts (DecisionRule), so
	// a request several rules matched is counted once.
	UsageHistory(ctx context.Context, f UsageFilter) ([]UsagePoint, error)
	// Violations returns the violation counts that match f, newest minute first.
	Violations(ctx context.Context, f ViolationFilter) ([]ViolationCount, error)
	// PruneCounts deletes the usage and violation counts of minutes before t (retention).
	PruneCounts(ctx context.Context, before time.Time) (int64, error)
	// WindowTotals sums the counts of the minutes in [from, to), in one consistent read, for
	// the abuse detector: usage per (rule, tenant), and the violations of requests without a
	// tenant per (rule, user, api key, ip), the identities that have no tenant to be judged
	// by. Each total's Minute is from; Endpoint and Limit are unset.
	// Both are ordered by rule, then tenant or identity, comparing bytes.
	WindowTotals(ctx context.Context, from, to time.Time) ([]UsageCount, []ViolationCount, error)

	// AcquireLease takes the named lease for holder until the store's clock plus ttl, or
	// renews it if holder has it already. It reports false when another holder's lease has not
	// expired: exactly one holder at a time runs a fleet-wide job such as the abuse detector.
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error)
	// Lease returns who holds the named lease and until when; ErrNotFound if nobody ever took
	// it or it was released. An expired lease is still returned (check ExpiresAt).
	Lease(ctx context.Context, name string) (holder string, expiresAt time.Time, _ error)
	// ReleaseLease gives the lease up if holder has it, so another node takes over at once.
	ReleaseLease(ctx context.Context, name, holder string) error

	// Ping checks that the database answers, for readiness and sluice_control_store_up.
	Ping(ctx context.Context) error
	// Close stops the Store's background work, closes its Watch channels and its connections.
	Close() error
}

// Options configure a Store; the zero value is ready to use.
type Options struct {
	// Now is the clock for timestamps and expiry; time.Now when nil. Tests inject their own.
	Now func() time.Time
	// Logger receives what goes wrong in the background (a lost PostgreSQL listener);
	// slog.Default() when nil.
	Logger *slog.Logger
}

// Log returns o.Logger, or slog.Default() when it is nil.
func (o Options) Log() *slog.Logger {
	if o.Logger == nil {
		return slog.Default()
	}
	return o.Logger
}

// Clock returns o.Now, or time.Now when it is nil.
func (o Options) Clock() func() time.Time {
	if o.Now == nil {
		return time.Now
	}
	return o.Now
}

// Change says who makes a change and why, and guards it against concurrent writers.
type Change struct {
	// Actor is who makes the change: a token's name, ActorAbuseDetector, "file:PATH". Required.
	Actor string
	// Reason is written to the audit event; when empty, the resource's own reason is used.
	Reason string
	// IfMatch, when set, must equal the resource's current ETag ("*" matches any existing
	// resource), or the change fails with ErrPreconditionFailed. Quotes and a W/ prefix of an
	// HTTP header are the caller's to strip.
	IfMatch string
	// Action, when set, is the audit event's action instead of the change's own (create,
	// update, delete): an automatic penalty says what caused it (ActionBurstWarning,
	// ActionBurstBlocked).
	Action Action
}

// Actors the system itself writes in the audit log.
const (
	// ActorSystem expires overrides and exemptions.
	ActorSystem = "system"
	// ActorAbuseDetector creates automatic penalties (docs/architecture.md, Control plane).
	ActorAbuseDetector = "abuse-detector"
)

// ETag renders a resource version as an opaque entity tag (without HTTP quotes). Versions are
// control versions, which never repeat, so an ETag names one state of one resource.
func ETag(version int64) string { return strconv.FormatInt(version, 10) }

// Rule is an API rule: the native rule fields as JSON, stored verbatim.
type Rule struct {
	Name string
	// Body is the rule object as the caller gave it (README.md, Policy).
	Body      json.RawMessage
	CreatedAt time.Time
	UpdatedAt time.Time
	// UpdatedBy is the actor of the last change.
	UpdatedBy string
	// Version is the control version of the last change; ETag() renders it.
	Version int64
}

// ETag returns the rule's entity tag.
func (r Rule) ETag() string { return ETag(r.Version) }

// Domain is an Envoy-format domain created at run time (docs/architecture.md, Envoy domains):
// its configuration in the reference service's format, a JSON object with domain and
// descriptors, stored verbatim.
type Domain struct {
	Name string
	// Body is the domain's configuration as JSON; its "domain" member is Name.
	Body      json.RawMessage
	CreatedAt time.Time
	UpdatedAt time.Time
	// UpdatedBy is the actor of the last change.
	UpdatedBy string
	// Version is the control version of the last change; ETag() renders it.
	Version int64
}

// ETag returns the domain's entity tag.
func (d Domain) ETag() string { return ETag(d.Version) }

// OverrideType says how an override changes a limit.
type OverrideType string

// Override types (docs/architecture.md, Policy snapshot).
const (
	OverrideBan        OverrideType = "ban"        // deny until it expires
	OverrideMultiplier OverrideType = "multiplier" // limit and burst times Value
	OverrideCustom     OverrideType = "custom"     // Limit and Burst replace the rule's
	// OverrideWarn leaves the limits as they are and makes their allowed decisions soft, with
	// a warning header: escalation's first penalty for a burst.
	OverrideWarn OverrideType = "warn"
)

// Source says where an override came from.
type Source string

// Sources stored in the control store. Policy files are the third source ("file"); they are
// never stored here.
const (
	SourceAPI       Source = "api"
	SourceAutomatic Source = "automatic"
)

// Override changes the effective limits of a target until ExpiresAt. Empty strings are unset
// fields; at least one of Tenant, User, APIKey, APIKeyHash, Endpoint, IP is set, and IP only
// alone (see Validate).
type Override struct {
	ID     int64  `json:"id"`
	Tenant string `json:"tenant,omitempty"`
	User   string `json:"user,omitempty"`
	APIKey string `json:"api_key,omitempty"`
	// APIKeyHash names an API key by its hash, as violations and usage show it ('#' and 32
	// lowercase hex digits); never with APIKey.
	APIKeyHash string `json:"api_key_hash,omitempty"`
	// IP is an address or CIDR in canonical form, with no other target.
	IP        string       `json:"ip,omitempty"`
	Endpoint  string       `json:"endpoint,omitempty"`
	Rule      string       `json:"rule,omitempty"` // empty: every rule
	Type      OverrideType `json:"type"`
	Value     float64      `json:"value,omitempty"`
	Limit     int64        `json:"limit,omitempty"`
	Burst     int64        `json:"burst,omitempty"`
	ExpiresAt time.Time    `json:"expires_at"`
	Reason    string       `json:"reason"`
	Source    Source       `json:"source"`
	CreatedBy string       `json:"created_by"`
	CreatedAt time.Time    `json:"created_at"`
	// Version is the control version of its last change (creation or update).
	Version int64 `json:"-"`
}

// ETag returns the override's entity tag.
func (o Override) ETag() string { return ETag(o.Version) }

// OverrideFilter selects overrides; empty fields match everything.
type OverrideFilter struct {
	Tenant, User, APIKey string
	Source               Source
	// AfterID and Limit select a page: the overrides of id > AfterID, at most Limit of them
	// (0: all), in id order.
	AfterID int64
	Limit   int
}

// Exemption names one caller that is allowed and not counted: exactly one of APIKey, User,
// Tenant, IP (an address or a CIDR, as the caller validated it).
type Exemption struct {
	ID     int64  `json:"id"`
	APIKey string `json:"api_key,omitempty"`
	User   string `json:"user,omitempty"`
	Tenant string `json:"tenant,omitempty"`
	IP     string `json:"ip,omitempty"`
	Reason string `json:"reason"`
	// ExpiresAt is nil for an exemption that never expires.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	CreatedBy string     `json:"created_by"`
	CreatedAt time.Time  `json:"created_at"`
	// Version is the control version of its last change (creation or update).
	Version int64 `json:"-"`
}

// ETag returns the exemption's entity tag.
func (e Exemption) ETag() string { return ETag(e.Version) }

// IdentityKind is what an identity assignment is keyed on.
type IdentityKind string

// Identity kinds (docs/architecture.md, Control plane).
const (
	IdentityAPIKey IdentityKind = "api_key"
	IdentityUser   IdentityKind = "user"
	IdentityTenant IdentityKind = "tenant"
)

// Identity assigns server-side attributes to an API key, a user or a tenant; assigned values
// win over the ones a request carries. Only an API key may carry Tenant and User.
type Identity struct {
	Kind   IdentityKind `json:"kind"`
	Value  string       `json:"value"`
	Tier   string       `json:"tier,omitempty"`
	Tenant string       `json:"tenant,omitempty"`
	User   string       `json:"user,omitempty"`
	// Trust is the adaptive-limit trust score in [0, 1]; nil when not assigned.
	Trust     *float64  `json:"trust,omitempty"`
	UpdatedBy string    `json:"updated_by"`
	UpdatedAt time.Time `json:"updated_at"`
	// Version is the control version of the last change.
	Version int64 `json:"-"`
}

// ETag returns the assignment's entity tag.
func (i Identity) ETag() string { return ETag(i.Version) }

// Role is what an admin token may do.
type Role string

// Roles, each including the ones before it (docs/architecture.md, Control plane).
const (
	RoleRead  Role = "read"  // every GET
	RoleWrite Role = "write" // read, every change and resets
	RoleAdmin Role = "admin" // write and tokens
)

// rank orders roles; 0 is not a role.
func (r Role) rank() int {
	switch r {
	case RoleRead:
		return 1
	case RoleWrite:
		return 2
	case RoleAdmin:
		return 3
	}
	return 0
}

// Allows reports whether a token of role r may do what needs role need.
func (r Role) Allows(need Role) bool { return r.rank() > 0 && r.rank() >= need.rank() }

// TokenHash is the SHA-256 of a token's secret; the secret itself is never stored.
type TokenHash [sha256.Size]byte

// HashToken returns the hash under which a token secret is stored and looked up. A plain
// SHA-256 is enough: secrets are random 256-bit values, not passwords, so there is nothing to
// guess that a slow hash would protect.
func HashToken(secret string) TokenHash { return sha256.Sum256([]byte(secret)) }

// Token is an admin API token.
type Token struct {
	Name string `json:"name"`
	Role Role   `json:"role"`
	// Hash is the secret's hash; it never leaves the store in JSON or audit events.
	Hash      TokenHash `json:"-"`
	CreatedBy string    `json:"created_by"`
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt is when the token stops authenticating (401); nil: never.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// LastUsedAt is when the token last authenticated, to within about a minute (TokenUsed is
	// called at most once a minute per token); nil: never used.
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
	// Version is the control version that created it.
	Version int64 `json:"-"`
}

// Expired reports whether the token no longer authenticates at now.
func (t Token) Expired(now time.Time) bool { return t.ExpiresAt != nil && !now.Before(*t.ExpiresAt) }

// ETag returns the token's entity tag.
func (t Token) ETag() string { return ETag(t.Version) }

// Action is what an audit event records.
type Action string

// Audit actions.
const (
	ActionCreate Action = "create"
	ActionUpdate Action = "update"
	ActionDelete Action = "delete"
	ActionExpire Action = "expire"
	// ActionBurstWarning records escalation's warning of a caller that burst at a rule (the
	// creation of a warn override); ActionBurstBlocked its ban for bursting again while
	// warned (the warning replaced by a ban).
	ActionBurstWarning Action = "burst_detected_warning"
	ActionBurstBlocked Action = "burst_detected_blocked"
)

// Valid reports whether a is one of the audit actions above.
func (a Action) Valid() bool {
	switch a {
	case ActionCreate, ActionUpdate, ActionDelete, ActionExpire, ActionBurstWarning, ActionBurstBlocked:
		return true
	}
	return false
}

// Kind is the kind of resource an audit event is about.
type Kind string

// Audit kinds.
const (
	KindRule        Kind = "rule"
	KindOverride    Kind = "override"
	KindExemption   Kind = "exemption"
	KindIdentity    Kind = "identity"
	KindToken       Kind = "token"
	KindPolicyFiles Kind = "policy_files"
	KindPenalty     Kind = "penalty"
	KindDomain      Kind = "domain"
)

// AuditEvent is one entry of the audit log.
type AuditEvent struct {
	ID     int64     `json:"id"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	Action Action    `json:"action"`
	Kind   Kind      `json:"kind"`
	// Target names the resource: a rule or token name, an override or exemption id,
	// "KIND/VALUE" for an identity, a file path.
	Target string `json:"target"`
	// Before and After are the resource as JSON before and after the change; nil for none.
	Before json.RawMessage `json:"before,omitempty"`
	After  json.RawMessage `json:"after,omitempty"`
	Reason string          `json:"reason,omitempty"`
	// Version is the control version of the change; 0 for events from AppendAudit.
	Version int64 `json:"version,omitempty"`
}

// AuditFilter selects audit events; zero fields match everything.
type AuditFilter struct {
	Since, Until time.Time // At in [Since, Until)
	Actor        string
	Action       Action
	Kind         Kind
	Target       string
	// BeforeID pages backwards: only events with a smaller ID.
	BeforeID int64
	// Limit caps the answer: DefaultAuditLimit when <= 0, at most MaxAuditLimit.
	Limit int
}

// Audit listing bounds.
const (
	DefaultAuditLimit = 100
	MaxAuditLimit     = 1000
)

// Node is one Sluice node's heartbeat.
type Node struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
	// PolicyVersion is the control version compiled into the snapshot the node enforces.
	PolicyVersion int64     `json:"policy_version"`
	SeenAt        time.Time `json:"seen_at"`
	// Stats is the node's live statistics as it last reported them (telemetry/fleetstats, JSON),
	// at most MaxNodeStatsLen bytes; nil when it reported none.
	Stats []byte `json:"stats,omitempty"`
}

// State is everything the compile step reads, at one control version.
type State struct {
	// Version is the control version the contents are at.
	Version int64
	// At is the store's clock when it was read; Overrides and Exemptions are those active then.
	// Later expiries are the compile step's to honour (each carries its ExpiresAt).
	At         time.Time
	Rules      []Rule
	Overrides  []Override
	Exemptions []Exemption
	Identities []Identity
	Domains    []Domain
}

// UsageCount is one node's decisions of one minute for one rule and tenant ("" for requests
// without a tenant): that rule's own result, per request it applied to. Rule DecisionRule ("")
// is instead the requests themselves, each counted once by its final state (denied if any
// limit denied it, soft if allowed and any limit was soft, else allowed).
type UsageCount struct {
	Minute                time.Time
	Rule, Tenant          string
	Allowed, Denied, Soft int64
}

// ViolationCount is the denied and soft decisions of one minute for one rule and identity.
// APIKey is what the caller chose to keep of the key (its hashed prefix, as in bucket keys), never
// the key itself.
type ViolationCount struct {
	Minute                                   time.Time
	Rule, Tenant, User, APIKey, IP, Endpoint string
	Denied, Soft                             int64
	// Limit is the rule's effective limit when it was counted; the last flush's value wins.
	Limit int64
}

// DecisionRule is UsageCount.Rule of a per-decision count, and UsageFilter.Rule that reads
// them: each request once, whatever rules it matched.
const DecisionRule = ""

// UsageFilter selects usage counts; an empty Tenant matches every tenant. Rule "" reads the
// per-decision counts (DecisionRule), a rule's name that rule's own counts.
type UsageFilter struct {
	Rule, Tenant string
	// From and To bound the minutes: [From, To).
	From, To time.Time
	// Step is the width of a point: a whole number of minutes, at most a day (1m, 1h, 1d).
	Step time.Duration
}

// UsagePoint is the sum of one step; At is its start.
type UsagePoint struct {
	At                    time.Time
	Allowed, Denied, Soft int64
}

// ViolationFilter selects violation counts; zero fields match everything.
type ViolationFilter struct {
	Tenant, User, APIKey, IP, Rule string
	Since, Until                   time.Time // minutes in [Since, Until)
	// Limit caps the answer: DefaultAuditLimit when <= 0, at most MaxAuditLimit.
	Limit int
}
