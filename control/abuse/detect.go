package abuse

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/internal/key"
)

// Target is what a share is computed for: a tenant, or for requests without a tenant one
// identity, named by its user, else its API key (as violations keep it: its hashed prefix),
// else its IP. Exactly one field is set.
type Target struct {
	Tenant, User, APIKey, IP string
}

// String names the target for logs: "tenant acme", "user john".
func (t Target) String() string {
	switch {
	case t.Tenant != "":
		return "tenant " + t.Tenant
	case t.User != "":
		return "user " + t.User
	case t.APIKey != "":
		return "api_key " + t.APIKey
	}
	return "ip " + t.IP
}

// compare orders targets for a run's deterministic order: tenants, users, API keys, IPs.
func (t Target) compare(u Target) int {
	rank := func(t Target) (int, string) {
		switch {
		case t.Tenant != "":
			return 0, t.Tenant
		case t.User != "":
			return 1, t.User
		case t.APIKey != "":
			return 2, t.APIKey
		}
		return 3, t.IP
	}
	tk, tv := rank(t)
	uk, uv := rank(u)
	return cmp.Or(cmp.Compare(tk, uk), strings.Compare(tv, uv))
}

// Penalizable reports whether an override can name the target: a tenant, a user, an API key
// by its hash (as the counts keep it) or an IP address. An identity the counts hold in some
// other form (a key not hashed, an address that does not parse) is flagged, not penalized.
func (t Target) Penalizable() bool {
	switch {
	case t.Tenant != "" || t.User != "":
		return true
	case t.APIKey != "":
		return key.IsHashedAPIKey(t.APIKey)
	}
	a, err := netip.ParseAddr(t.IP)
	return err == nil && a.Zone() == ""
}

// identity is the target of a violation count without a tenant; zero when it names nobody.
func identity(v control.ViolationCount) Target {
	switch {
	case v.User != "":
		return Target{User: v.User}
	case v.APIKey != "":
		return Target{APIKey: v.APIKey}
	case v.IP != "":
		// In the form an ip override keeps it, so that one names the other (see covered).
		return Target{IP: control.CanonicalIP(v.IP)}
	}
	return Target{}
}

// Flag is a target found throttled over the window, on the rule where its share is largest.
type Flag struct {
	Target Target
	Rule   string
	// Throttled (denied and soft) of Requests under Rule; for an identity without a tenant,
	// Requests counts the rule's allowed tenant-less requests, which bound its own.
	Throttled, Requests int64
	// Severity is SeverityHigh or SeverityMedium.
	Severity string
	// Override is the penalty created; nil for severity medium, a target that is not
	// Penalizable, or one Skipped.
	Override *control.Override
	// Skipped is set for a penalty that the run's cap (Config.MaxPenalties) left out.
	Skipped bool
}

// worstFirst orders flags by how badly they abuse: the larger share first, then more
// throttled requests, then by target, so that the cap on penalties spares the mildest and
// a run's choice is deterministic.
func worstFirst(a, b Flag) int {
	return cmp.Or(cmp.Compare(b.Share(), a.Share()), cmp.Compare(b.Throttled, a.Throttled), a.Target.compare(b.Target))
}

// Share is Throttled / Requests.
func (f Flag) Share() float64 { return float64(f.Throttled) / float64(f.Requests) }

// percent is the share in whole percent, rounded down, as the override's reason says it.
func (f Flag) percent() int64 { return f.Throttled * 100 / f.Requests }

// tally is a target's counts under one rule.
type tally struct {
	rule                string
	throttled, requests int64
	// known is how many requests the target surely sent: requests for a tenant, throttled
	// for an identity without a tenant. MinRequests applies to it.
	known int64
}

func (t tally) share() float64 { return float64(t.throttled) / float64(t.requests) }

// Reason is the penalty override's reason: "automatic abuse detection: 85% throttled over 5m".
func Reason(percent int64, window time.Duration) string {
	return fmt.Sprintf("automatic abuse detection: %d%% throttled over %s", percent, fmtDuration(window))
}

// severity is the severity of share, or "" for none.
func (c Config) severity(share float64) string {
	switch {
	case share > c.Threshold:
		return SeverityHigh
	case share >= MediumShare:
		return SeverityMedium
	}
	return ""
}

// judge returns, per target, its rule of largest share among those with at least MinRequests
// known requests, for the targets whose share has a severity.
func (c Config) judge(usage []control.UsageCount, violations []control.ViolationCount) []Flag {
	best := map[Target]tally{}
	consider := func(t Target, cur tally) {
		if cur.known < c.MinRequests || cur.requests <= 0 {
			return
		}
		old, ok := best[t]
		// The larger share wins; on a tie, more requests, then the first rule by name.
		if !ok || cur.share() > old.share() || cur.share() == old.share() &&
			(cur.requests > old.requests || cur.requests == old.requests && cur.rule < old.rule) {
			best[t] = cur
		}
	}
	pool := map[string]int64{} // per rule: allowed requests without a tenant
	for _, u := range usage {
		if u.Tenant == "" {
			pool[u.Rule] += u.Allowed
			continue
		}
		n := u.Allowed + u.Denied + u.Soft
		consider(Target{Tenant: u.Tenant}, tally{rule: u.Rule, throttled: u.Denied + u.Soft, requests: n, known: n})
	}
	// One user shows up with several IPs and API keys: sum per target and rule first.
	type targetRule struct {
		t    Target
		rule string
	}
	ids := map[targetRule]int64{}
	for _, v := range violations {
		if t := identity(v); t != (Target{}) {
			ids[targetRule{t, v.Rule}] += v.Denied + v.Soft
		}
	}
	for k, throttled := range ids {
		consider(k.t, tally{rule: k.rule, throttled: throttled, requests: throttled + pool[k.rule], known: throttled})
	}
	var flags []Flag
	for t, b := range best {
		if s := c.severity(b.share()); s != "" {
			flags = append(flags, Flag{Target: t, Rule: b.rule, Throttled: b.throttled, Requests: b.requests, Severity: s})
		}
	}
	slices.SortFunc(flags, func(a, b Flag) int { return a.Target.compare(b.Target) })
	return flags
}

// Detect runs one pass at the detector's clock, whether or not this node holds the lease (Step
// runs it when it does): it returns the targets it flagged, with the overrides it created.
// A failure to create one override does not stop the others; the errors are joined.
func (d *Detector) Detect(ctx context.Context) ([]Flag, error) {
	now := d.now()
	c := d.o.Config
	// The minutes that overlap [now-Window, now]: the current one is included, so a target
	// is caught within an interval of its counts reaching the store.
	from := now.Add(-c.Window).Truncate(time.Minute)
	usage, violations, err := d.o.Store.WindowTotals(ctx, from, now)
	if err != nil {
		return nil, fmt.Errorf("abuse: read counts: %w", err)
	}
	candidates := c.judge(usage, violations)
	if len(candidates) == 0 {
		return nil, nil
	}
	covered, networks, err := d.covered(ctx, from)
	if err != nil {
		return nil, err
	}
	// The worst offenders first, so that the cap on penalties per run spares them last.
	slices.SortFunc(candidates, worstFirst)
	var flags []Flag
	var errs []error
	penalties, skipped := 0, 0
	for _, f := range candidates {
		if covered[f.Target] || inNetworks(f.Target, networks) {
			continue
		}
		if f.Severity == SeverityHigh && f.Target.Penalizable() {
			if penalties >= c.MaxPenalties {
				// Flagged but not penalized; logged once below rather than per target, as a
				// probe of made-up names would otherwise flood the log instead of the store.
				f.Skipped = true
				skipped++
				d.o.Metrics.Flag(f.Severity)
				flags = append(flags, f)
				continue
			}
			o, err := d.penalize(ctx, f)
			switch {
			case errors.Is(err, control.ErrConflict):
				continue // an override for it was made since covered() looked
			case err != nil:
				errs = append(errs, fmt.Errorf("abuse: penalize %s: %w", f.Target, err))
				continue
			}
			penalties++
			f.Override = &o
		}
		d.o.Metrics.Flag(f.Severity)
		d.logFlag(f)
		flags = append(flags, f)
	}
	if skipped > 0 {
		d.o.Metrics.PenaltiesSkipped(skipped)
		d.log.Warn("abuse detector: penalty cap reached; the other targets are judged again next run",
			"max_penalties", c.MaxPenalties, "skipped", skipped)
	}
	slices.SortFunc(flags, func(a, b Flag) int { return a.Target.compare(b.Target) })
	return flags, errors.Join(errs...)
}

// covered returns the targets to leave alone: those an active override names, whoever made
// it (and the networks of active ip overrides: an address in one is covered too, or its
// penalty, the longer prefix, would replace an operator's ban of the network for it),
// it, and those whose last automatic penalty ended after from, so that the window holds none
// of the requests the penalty itself throttled.
func (d *Detector) covered(ctx context.Context, from time.Time) (map[Target]bool, []netip.Prefix, error) {
	active, err := d.o.Store.ListOverrides(ctx, control.OverrideFilter{})
	if err != nil {
		return nil, nil, fmt.Errorf("abuse: list overrides: %w", err)
	}
	covered := map[Target]bool{}
	var networks []netip.Prefix
	for _, o := range active {
		if t, ok := overrideTarget(o); ok {
			covered[t] = true
		}
		if p, err := netip.ParsePrefix(o.IP); err == nil && !p.IsSingleIP() {
			networks = append(networks, p)
		}
	}
	// A penalty that ends after from began after from-Penalty. The audit log is read rather
	// than the overrides because an expired override is deleted; its creation stays audited.
	f := control.AuditFilter{
		Actor: control.ActorAbuseDetector, Kind: control.KindOverride, Action: control.ActionCreate,
		Since: from.Add(-d.o.Config.Penalty), Limit: control.MaxAuditLimit,
	}
	for {
		events, err := d.o.Store.Audit(ctx, f)
		if err != nil {
			return nil, nil, fmt.Errorf("abuse: read past penalties: %w", err)
		}
		for _, e := range events {
			var o control.Override
			if json.Unmarshal(e.After, &o) != nil || !o.ExpiresAt.After(from) {
				continue
			}
			if t, ok := overrideTarget(o); ok {
				covered[t] = true
			}
		}
		if len(events) < f.Limit {
			return covered, networks, nil
		}
		f.BeforeID = events[len(events)-1].ID
	}
}

// inNetworks reports whether t is an address inside one of networks.
func inNetworks(t Target, networks []netip.Prefix) bool {
	if t.IP == "" || len(networks) == 0 {
		return false
	}
	a, err := netip.ParseAddr(t.IP)
	if err != nil {
		return false
	}
	for _, p := range networks {
		if p.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}

// overrideTarget is the target an override names exactly (its endpoint and rule aside): a
// tenant alone, a user alone, an API key alone (by its hash, or the key hashed as the counts
// keep it) or one IP address (a CIDR of one address included).
func overrideTarget(o control.Override) (Target, bool) {
	switch {
	case o.IP != "":
		p, err := netip.ParsePrefix(o.IP)
		if err == nil && p.IsSingleIP() {
			return Target{IP: p.Addr().String()}, true
		}
		return Target{IP: o.IP}, true
	case o.Tenant != "" && o.User != "":
	case o.APIKey != "" || o.APIKeyHash != "":
		if o.Tenant != "" || o.User != "" {
			return Target{}, false
		}
		if o.APIKeyHash != "" {
			return Target{APIKey: o.APIKeyHash}, true
		}
		return Target{APIKey: key.HashedAPIKey(o.APIKey)}, true
	case o.Tenant != "":
		return Target{Tenant: o.Tenant}, true
	case o.User != "":
		return Target{User: o.User}, true
	}
	return Target{}, false
}

// penalize creates f's automatic override, lasting Penalty from now: the clock is read again
// rather than at the run's start, so that the override lives its whole Penalty however long
// the run took to get to it.
func (d *Detector) penalize(ctx context.Context, f Flag) (control.Override, error) {
	c := d.o.Config
	o, err := d.o.Store.CreateOverride(ctx, control.Change{Actor: control.ActorAbuseDetector}, control.Override{
		Tenant: f.Target.Tenant, User: f.Target.User, APIKeyHash: f.Target.APIKey, IP: f.Target.IP,
		Type: control.OverrideMultiplier, Value: c.Multiplier, ExpiresAt: d.now().Add(c.Penalty),
		Reason: Reason(f.percent(), c.Window), Source: control.SourceAutomatic,
	})
	if err != nil {
		return o, err
	}
	d.o.Metrics.OverrideApplied(o.Type, o.Source)
	return o, nil
}

// logFlag logs a flag: a penalty at Warn, the rest at Info.
func (d *Detector) logFlag(f Flag) {
	args := []any{"target", f.Target.String(), "severity", f.Severity, "rule", f.Rule,
		"throttled", f.Throttled, "requests", f.Requests, "share", fmt.Sprintf("%.3f", f.Share()), "window", fmtDuration(d.o.Config.Window)}
	switch {
	case f.Override != nil:
		d.log.Warn("abuse detected: penalty applied", append(args, "override", f.Override.ID,
			"multiplier", f.Override.Value, "expires_at", f.Override.ExpiresAt.Format(time.RFC3339))...)
	case f.Severity == SeverityHigh:
		d.log.Warn("abuse detected: no override can name this caller (an API key not hashed, an address that does not parse); not penalized", args...)
	default:
		d.log.Info("abuse suspected: throttled share above medium, below the threshold", args...)
	}
}
