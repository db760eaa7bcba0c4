package policy

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
)

// Bounds of an escalation's penalty: a warning or ban shorter than a second would end before
// every node enforces it (within 1 s); the longest is a period's.
const (
	minPenalty = time.Second
	maxPenalty = algorithm.MaxPeriod
)

// escalation is a rule's compiled burst detector (Rule.Escalation).
//
// Each request of a caller that escalation can name sends, with its limits, a counter op
// (store.Op.Counter) on the caller's own counter for the rule: a fixed window of Threshold+1
// per Window. A counter counts denied requests too and never denies one. The request that
// takes the last unit, the (Threshold+1)th of its window, is told so by an allowed result with
// nothing remaining: exactly one request of the fleet per burst and window, so each burst
// is reported once however many nodes see it.
type escalation struct {
	window, penalty time.Duration
	threshold       int64
	params          algorithm.Params
	head            []byte // sl:<rule>:!burst; real rules' heads have 8 hex digits there
}

// compileEscalation checks e and compiles it for the rule called name.
func compileEscalation(name string, e *Escalation) (*escalation, []error) {
	var errs []error
	window, penalty := time.Duration(e.Window), time.Duration(e.Penalty)
	if window == 0 {
		errs = append(errs, &FieldError{Field: "escalation.window", Msg: "required (e.g. 10s)"})
	} else if err := checkPeriod("escalation.window", window); err != nil {
		errs = append(errs, err)
	}
	if e.Threshold < 1 || e.Threshold >= algorithm.MaxLimit {
		errs = append(errs, &FieldError{Field: "escalation.threshold", Msg: fmt.Sprintf("must be from 1 to %d requests, got %d", int64(algorithm.MaxLimit)-1, e.Threshold)})
	}
	if penalty < minPenalty || penalty > maxPenalty {
		errs = append(errs, &FieldError{Field: "escalation.penalty", Msg: fmt.Sprintf("must be from %s to %dd (e.g. 5m), got %s", minPenalty, maxPenalty/(24*time.Hour), penalty)})
	}
	if len(errs) > 0 {
		return nil, errs
	}
	p, err := algorithm.NewParams(algorithm.FixedWindow, e.Threshold+1, 0, window)
	if err != nil {
		return nil, []error{&FieldError{Field: "escalation.window", Msg: err.Error()}}
	}
	return &escalation{
		window: window, penalty: penalty, threshold: e.Threshold, params: p,
		head: key.AppendHead(nil, name, "!burst"),
	}, nil
}

// Escalation returns the rule's escalation: more than threshold requests within window
// warns the caller, or bans it when warned, for penalty. ok is false for a rule without one.
func (c *CompiledRule) Escalation() (window time.Duration, threshold int64, penalty time.Duration, ok bool) {
	if c.esc == nil {
		return 0, 0, 0, false
	}
	return c.esc.window, c.esc.threshold, c.esc.penalty, true
}

// AppendBurstKey appends to dst the key of the burst counter of rule c (its escalation) for
// r's caller, and reports true; it reports false, appending nothing, when c has no escalation
// or escalation cannot name the caller. Escalation names a caller by its API key, or by its
// user (with its tenant, as users are a tenant's); one known only by its address, or not at
// all, is not counted, as no override names an address. The key is
// sl:<rule>:!burst:{a=#<hash>} for an API key, sl:<rule>:!burst:{u=<user>}:<tenant> for a
// user: the caller's tag puts it on the slot of the caller's other limits. sc is the Scratch
// that r was resolved in, whose hash of the API key it reuses.
func (sc *Scratch) AppendBurstKey(dst []byte, c *CompiledRule, r *Request) ([]byte, bool) {
	if c.esc == nil || r.APIKey == "" && r.User == "" {
		return dst, false
	}
	dst = append(dst, c.esc.head...)
	if r.APIKey != "" {
		return key.AppendTagPart(dst, 'a', sc.apiKeyPart(r.APIKey)), true
	}
	dst = key.AppendTag(dst, 'u', r.User)
	return key.AppendValue(dst, r.Tenant), true
}

// BurstParams returns the parameters of c's burst counters (a fixed window of threshold+1 per
// window), or nil when c has no escalation.
func (c *CompiledRule) BurstParams() *algorithm.Params {
	if c.esc == nil {
		return nil
	}
	return &c.esc.params
}

// Escalates reports whether a rule of the snapshot has an escalation: only then do its
// requests send counter ops (AppendBurstKey).
func (s *Snapshot) Escalates() bool { return s.escalates }

// Warns reports whether an override of the snapshot is a warning: only then may a limit carry
// a Warning.
func (s *Snapshot) Warns() bool { return s.warns }

// BurstOver reports whether a counter op's result says its request crossed the threshold: it
// took the window's last unit. Only a request that counted (cost > 0) can.
func BurstOver(allowed bool, remaining, cost int64) bool {
	return allowed && remaining == 0 && cost > 0
}

// warningText is the X-RateLimit-Warning of a warning override for rule ("" for every rule)
// with reason: printable ASCII only, as a header value should be.
func warningText(rule, reason string) string {
	var s string
	switch {
	case rule != "" && reason != "":
		s = fmt.Sprintf("rule %q: %s", rule, reason)
	case rule != "":
		s = fmt.Sprintf("warned on rule %q", rule)
	case reason != "":
		s = reason
	default:
		return "warned"
	}
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c >= 0x7f {
			b[i] = '?'
		}
	}
	return string(b)
}
