package policy

import (
	"fmt"
	"math"
	"math/bits"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
)

// shape is the set of attributes an override's target names, one bit each. The bits are in
// the order of identity specificity (api_key > user > tenant > endpoint), so that among shapes
// with as many attributes the larger number is the more specific: see moreSpecific.
type shape uint8

const (
	shapeEndpoint shape = 1 << iota
	shapeTenant
	shapeUser
	shapeAPIKey
	// shapeIP is an address or CIDR target. It stands alone (no other attribute with it) and
	// is the most specific single attribute: it names one client, or a few.
	shapeIP
)

// moreSpecific reports whether an override of shape a beats one of shape b when both match a
// request. The order is total: the target naming more attributes wins; between as many, the
// one whose most specific attribute is more specific (api_key, then user, then tenant, then
// endpoint), and so on down. It extends the documented order (tenant+user+endpoint, then
// tenant+user, then tenant+endpoint, then tenant) to every combination of the four.
func (a shape) moreSpecific(b shape) bool {
	if na, nb := bits.OnesCount8(uint8(a)), bits.OnesCount8(uint8(b)); na != nb {
		return na > nb
	}
	return a > b
}

// target is where an override applies: the values of the attributes its shape names, the
// others empty. The API key is in the hashed form key.AppendSecret writes, never the key
// itself.
type target struct {
	tenant, user, endpoint, apiKey string
	ip                             netip.Prefix // shapeIP alone
}

// singleIndex returns the index in Snapshot.single of a shape of one attribute, or -1.
func singleIndex(sh shape) int {
	if sh == shapeIP || bits.OnesCount8(uint8(sh)) != 1 {
		return -1
	}
	return bits.TrailingZeros8(uint8(sh))
}

// value returns the value of the one attribute of shape sh.
func (t *target) value(sh shape) string {
	switch sh {
	case shapeTenant:
		return t.tenant
	case shapeUser:
		return t.user
	case shapeEndpoint:
		return t.endpoint
	}
	return t.apiKey
}

type compiledOverride struct {
	target
	shape     shape
	rule      string
	kind      overrideKind
	value     float64
	limit     int64
	burst     int64
	expiresAt time.Time
	// Reason and source travel with decisions that an override shaped.
	Reason, Source string
	// warning is a warning override's X-RateLimit-Warning: its reason, after its rule.
	warning string
	// id is the control store's id of an override made at run time; 0 for a file's.
	id int64
}

type overrideKind uint8

const (
	overrideBan overrideKind = iota + 1
	overrideMultiplier
	overrideCustom
	// overrideWarn leaves the limit as it is and makes its allowed decisions soft, with a
	// warning: escalation's first penalty. It is looked up apart from the others (see
	// findOverride), so a warning never lifts a penalty of a less specific target.
	overrideWarn
)

// maxMultiplier bounds a multiplier override: a limit at most 1000 times its rule's.
const maxMultiplier = 1000

// Override sources (docs/architecture.md, Policy snapshot): a policy file's, the admin API's, or an automatic
// penalty's. "operator" is what files said before "file", kept so that they still load.
const (
	SourceFile      = "file"
	SourceAPI       = "api"
	SourceAutomatic = "automatic"
	sourceOperator  = "operator"
)

// The Source values an override may carry: in a file (where empty means "file"), and from
// the control store.
var (
	fileSources    = []string{"", SourceFile, sourceOperator, SourceAutomatic}
	controlSources = []string{SourceAPI, SourceAutomatic}
)

func (s *Snapshot) compileOverride(o *Override, sources []string) (*compiledOverride, []error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	c := &compiledOverride{
		rule: o.Rule, value: o.Value, limit: o.Limit, burst: o.Burst, expiresAt: o.ExpiresAt,
		Reason: o.Reason, Source: o.Source,
	}
	c.tenant, c.user, c.endpoint = o.Tenant, o.User, o.Endpoint
	for _, f := range [...]struct {
		v   string
		bit shape
	}{{o.Endpoint, shapeEndpoint}, {o.Tenant, shapeTenant}, {o.User, shapeUser}, {o.APIKey, shapeAPIKey}} {
		if f.v != "" {
			c.shape |= f.bit
		}
	}
	if o.APIKey != "" {
		c.apiKey = string(key.AppendSecret(nil, o.APIKey))
	}
	if o.APIKeyHash != "" {
		if h, msg := apiKeyHash(o); msg != "" {
			bad("api_key_hash", "%s", msg)
		} else {
			c.shape, c.apiKey = c.shape|shapeAPIKey, h
		}
	}
	if o.IP != "" {
		p, err := parsePrefix(o.IP)
		switch {
		case err != nil:
			bad("ip", "%v", err)
		case c.shape != 0:
			bad("ip", "an ip override names no other target (tenant, user, api_key, api_key_hash, endpoint)")
		default:
			c.shape, c.ip = shapeIP, p
		}
	}
	if c.shape == 0 && o.IP == "" && o.APIKeyHash == "" {
		bad("tenant", "an override needs a target: tenant, user, api_key, api_key_hash, endpoint or ip")
	}
	for i, v := range [...]string{o.Tenant, o.User, o.APIKey, o.Endpoint} {
		if len(v) > MaxAttribute {
			bad([...]string{"tenant", "user", "api_key", "endpoint"}[i], "longer than %d bytes, so no request can match it", MaxAttribute)
		}
	}
	if strings.Contains(o.Endpoint, "*") {
		bad("endpoint", "an override names one endpoint; wildcards belong in rules")
	}
	if o.Rule != "" && s.byName[o.Rule] == nil && !s.envoy.NamesLimit(o.Rule) {
		bad("rule", "no rule named %q (nor an Envoy limit of that name or stat key)", o.Rule)
	}
	if o.ExpiresAt.IsZero() {
		bad("expires_at", "required (RFC 3339, e.g. 2026-12-01T00:00:00Z)")
	}
	switch {
	case !slices.Contains(sources, c.Source):
		bad("source", "%q is not one of %s", o.Source, strings.Join(slices.DeleteFunc(slices.Clone(sources), func(v string) bool { return v == "" || v == sourceOperator }), ", "))
	case c.Source == "" || c.Source == sourceOperator:
		c.Source = SourceFile
	}
	// Fields that the type does not use are mistakes, not silently dropped.
	unused := func(field string, set bool, typ string) {
		if set {
			bad(field, "does not apply to a %s override", typ)
		}
	}
	switch o.Type {
	case OverrideBan:
		c.kind = overrideBan
		unused("value", o.Value != 0, o.Type)
		unused("limit", o.Limit != 0, o.Type)
		unused("burst", o.Burst != 0, o.Type)
	case OverrideMultiplier:
		c.kind = overrideMultiplier
		if !(o.Value > 0) || o.Value > maxMultiplier {
			bad("value", "a multiplier must be above 0 and at most %d, got %v", maxMultiplier, o.Value)
		}
		unused("limit", o.Limit != 0, o.Type)
		unused("burst", o.Burst != 0, o.Type)
	case OverrideCustom:
		c.kind = overrideCustom
		switch {
		case o.Limit != 0 && o.Value != 0:
			bad("value", "a custom override sets limit; value is the older spelling of it, not both")
		case o.Limit == 0 && o.Value == 0:
			bad("limit", "a custom override sets limit (and optionally burst)")
		case o.Limit != 0:
			if err := checkCount("limit", o.Limit); err != nil {
				errs = append(errs, err)
			}
		case o.Value != math.Trunc(o.Value) || o.Value < 1 || o.Value > algorithm.MaxLimit:
			// Checked before the conversion, which is undefined for values past int64.
			bad("value", "a custom limit must be a whole number from 1 to %d, got %v", int64(algorithm.MaxLimit), o.Value)
		default:
			c.limit = int64(o.Value)
		}
		if o.Burst != 0 {
			if err := checkCount("burst", o.Burst); err != nil {
				errs = append(errs, err)
			}
		}
	case OverrideWarn:
		c.kind = overrideWarn
		unused("value", o.Value != 0, o.Type)
		unused("limit", o.Limit != 0, o.Type)
		unused("burst", o.Burst != 0, o.Type)
		c.warning = warningText(o.Rule, o.Reason)
	default:
		bad("type", "%q is not ban, multiplier, custom or warn", o.Type)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return c, nil
}
