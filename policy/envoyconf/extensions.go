package envoyconf

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"go.yaml.in/yaml/v3"
)

// Escalation is a limit's burst detector, the Sluice extension `escalation: {window,
// threshold, penalty}` inside a rate_limit, with a native rule's meaning (DESIGN.md, "Abuse
// detection and escalation"): a caller that sends more than Threshold requests to the limit
// within Window is warned for Penalty, and banned from it for Penalty when it does it again
// while warned.
type Escalation struct {
	Window, Penalty time.Duration
	Threshold       int64
	// Params are those of the burst counters: a fixed window of Threshold+1 per Window.
	Params algorithm.Params
}

// The regions modes of a limit (Limit.Regions), as a native rule's regions field.
const (
	RegionsGlobal = "global"
	regionsHome   = "home:"
)

// Bounds of an escalation's penalty, as for native rules: shorter than a second would end
// before every node enforces it.
const (
	minPenalty = time.Second
	maxPenalty = algorithm.MaxPeriod
)

var escalationFields = []string{"window", "threshold", "penalty"}

// HomeRegion returns the region that decides the limit when its regions is home:NAME.
func (l *Limit) HomeRegion() (string, bool) {
	home, ok := strings.CutPrefix(l.Regions, regionsHome)
	if !ok {
		return "", false
	}
	return home, true
}

// escalation compiles an escalation block; nil when it is null or invalid.
func (p *parser) escalation(v *yaml.Node, path string) *Escalation {
	v = p.resolve(v)
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.MappingNode {
		p.errorf(v.Line, path, "must be a mapping {window, threshold, penalty}, got %s", kindName(v))
		return nil
	}
	nerr := len(p.errs)
	e := &Escalation{}
	var windowLine, thresholdLine, penaltyLine int
	p.fields(v, path, escalationFields, func(field string, k, val *yaml.Node) {
		fpath := join(path, field)
		switch field {
		case "window":
			e.Window, _ = p.duration(val, fpath)
			windowLine = k.Line
		case "threshold":
			n, _ := p.uint(val, fpath, 40)
			e.Threshold = int64(n)
			thresholdLine = k.Line
		case "penalty":
			e.Penalty, _ = p.duration(val, fpath)
			penaltyLine = k.Line
		}
	})
	if len(p.errs) > nerr {
		return nil
	}
	switch {
	case windowLine == 0:
		p.errorf(v.Line, join(path, "window"), "required (e.g. 10s)")
	case e.Window < algorithm.MinPeriod || e.Window > algorithm.MaxPeriod:
		p.errorf(windowLine, join(path, "window"), "must be from %s to %dd, got %s", algorithm.MinPeriod, algorithm.MaxPeriod/(24*time.Hour), e.Window)
	case e.Window%time.Microsecond != 0:
		p.errorf(windowLine, join(path, "window"), "must be a whole number of microseconds, got %s", e.Window)
	}
	if thresholdLine == 0 {
		thresholdLine = v.Line
	}
	if e.Threshold < 1 || e.Threshold >= algorithm.MaxLimit {
		p.errorf(thresholdLine, join(path, "threshold"), "must be from 1 to %d requests, got %d", int64(algorithm.MaxLimit)-1, e.Threshold)
	}
	if penaltyLine == 0 {
		penaltyLine = v.Line
	}
	if e.Penalty < minPenalty || e.Penalty > maxPenalty {
		p.errorf(penaltyLine, join(path, "penalty"), "must be from %s to %dd (e.g. 5m), got %s", minPenalty, maxPenalty/(24*time.Hour), e.Penalty)
	}
	if len(p.errs) > nerr {
		return nil
	}
	params, err := algorithm.NewParams(algorithm.FixedWindow, e.Threshold+1, 0, e.Window)
	if err != nil {
		p.errorf(windowLine, join(path, "window"), "%v", err)
		return nil
	}
	e.Params = params
	return e
}

// duration reads a duration such as 10s, 5m or 1d (Go's units and d for 24 hours).
func (p *parser) duration(v *yaml.Node, path string) (time.Duration, bool) {
	s, ok := p.str(v, path)
	if !ok {
		return 0, false
	}
	var d time.Duration
	var err error
	if n, days := strings.CutSuffix(s, "d"); days {
		var f float64
		f, err = strconv.ParseFloat(n, 64)
		d = time.Duration(f * float64(24*time.Hour))
		if err == nil && (f < 0 || f > float64(algorithm.MaxPeriod/(24*time.Hour))*2) {
			err = fmt.Errorf("out of range")
		}
	} else {
		d, err = time.ParseDuration(s)
	}
	if err != nil || s == "" {
		p.errorf(v.Line, path, "must be a duration such as 10s, 5m or 1d, got %q", s)
		return 0, false
	}
	return d, true
}

// regions checks a rate_limit's regions value for a limit of algorithm kind: global needs a
// window algorithm, whose state is a count per window, which is what regions exchange.
func (p *parser) regions(v string, line int, path string, kind algorithm.Kind) {
	switch {
	case v == RegionsGlobal:
		if kind != algorithm.FixedWindow && kind != algorithm.SlidingWindowCounter {
			p.errorf(line, path, "global needs a window algorithm (fixed_window or sliding_window_counter), not %s", kind)
		}
	case strings.HasPrefix(v, regionsHome):
		if msg := ValidRegionName(strings.TrimPrefix(v, regionsHome)); msg != "" {
			p.errorf(line, path, "home:NAME: %s", msg)
		}
	default:
		p.errorf(line, path, "%q is not global or home:NAME", v)
	}
}

// maxRegionName bounds a region's name, which travels in every sync message and metric label.
const maxRegionName = 64

// ValidRegionName returns why name cannot name a region, or "" when it can: 1 to 64 letters,
// digits, '-', '_' or '.'.
func ValidRegionName(name string) string {
	if name == "" {
		return "empty region name"
	}
	if len(name) > maxRegionName {
		return "region name longer than 64 bytes"
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Sprintf("region name %q holds a character other than letters, digits, '-', '_' and '.'", name)
		}
	}
	return ""
}
