package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/abuse"
	"github.com/sluicehq/sluice/policy"
)

// abuseFlags is the abuse detector's part of serve's configuration (docs/architecture.md, Abuse
// and escalation).
type abuseFlags struct {
	enabled bool
	cfg     abuse.Config
}

// abuseEnv names the environment variable of each --abuse-* flag: the seeds' ABUSE_* names, and
// SLUICE_* for the flags the seeds did not have.
var abuseEnv = []struct{ flag, env string }{
	{"abuse-detection", "ABUSE_DETECTION"},
	{"abuse-interval", "ABUSE_INTERVAL"},
	{"abuse-window", "ABUSE_WINDOW"},
	{"abuse-threshold", "ABUSE_THRESHOLD"},
	{"abuse-min-requests", "ABUSE_MIN_REQUESTS"},
	{"abuse-multiplier", "ABUSE_MULTIPLIER"},
	{"abuse-penalty", "ABUSE_PENALTY"},
	{"abuse-max-penalties", "SLUICE_ABUSE_MAX_PENALTIES"},
}

// addAbuseFlags defines the --abuse-* flags on f, with the documented defaults.
func addAbuseFlags(f *pflag.FlagSet, a *abuseFlags) {
	a.enabled, a.cfg = true, abuse.DefaultConfig()
	f.BoolVar(&a.enabled, "abuse-detection", true, "run the abuse detector: one node of the fleet at a time penalizes tenants (and users without a tenant) whose requests are mostly throttled, with an automatic multiplier override (ABUSE_DETECTION)")
	f.Var(durationFlag{&a.cfg.Interval}, "abuse-interval", "how often the abuse detector runs, 1s to 1d (ABUSE_INTERVAL)")
	f.Var(durationFlag{&a.cfg.Window}, "abuse-window", "how far back the abuse detector looks, in minutes of counts, 1m to 1d (ABUSE_WINDOW)")
	f.Float64Var(&a.cfg.Threshold, "abuse-threshold", a.cfg.Threshold, "share of a tenant's requests to one rule, denied or soft over the window, above which it is penalized; 0.6 up to it is flagged medium (ABUSE_THRESHOLD)")
	f.Int64Var(&a.cfg.MinRequests, "abuse-min-requests", a.cfg.MinRequests, "requests to one rule within the window below which a tenant is not judged on it (ABUSE_MIN_REQUESTS)")
	f.Float64Var(&a.cfg.Multiplier, "abuse-multiplier", a.cfg.Multiplier, "the penalty: the tenant's limits times this factor, above 0 and below 1 (ABUSE_MULTIPLIER)")
	f.Var(durationFlag{&a.cfg.Penalty}, "abuse-penalty", "how long a penalty lasts, 1s to 30d (ABUSE_PENALTY)")
	f.IntVar(&a.cfg.MaxPenalties, "abuse-max-penalties", a.cfg.MaxPenalties, "most penalties one run creates, 1 to 10000: the worst offenders first, the rest counted in sluice_abuse_penalties_skipped_total and judged again next run (SLUICE_ABUSE_MAX_PENALTIES)")
}

// applyAbuseEnv sets each --abuse-* flag not given on the command line from its ABUSE_*
// variable. A value that does not parse is an error naming both, never silently the default.
func applyAbuseEnv(f *pflag.FlagSet) error {
	for _, e := range abuseEnv {
		v, ok := os.LookupEnv(e.env)
		if !ok || f.Changed(e.flag) {
			continue
		}
		if err := f.Set(e.flag, v); err != nil {
			return fmt.Errorf("%s=%q (--%s): %w", e.env, v, e.flag, err)
		}
	}
	return nil
}

// validate checks the values, naming the flag of the first bad one. They are checked with
// the detector off too: a bad value in a deployment's settings should not wait to surface
// until someone turns it on.
func (a abuseFlags) validate() error {
	err := a.cfg.Validate()
	if fe, ok := errors.AsType[*policy.FieldError](err); ok {
		return fmt.Errorf("--abuse-%s: %s", fe.Field, fe.Msg)
	}
	return err
}

// abuseRuntime is the abuse detector as serve runs it.
type abuseRuntime struct {
	det *abuse.Detector // nil with --abuse-detection=false
	m   *abuse.Metrics
}

// startAbuse registers the abuse metrics with reg and, unless --abuse-detection=false, starts
// the detector on ctrl as holder (the node id).
func startAbuse(ctx context.Context, a abuseFlags, ctrl control.Store, holder string, reg prometheus.Registerer, log *slog.Logger) (*abuseRuntime, error) {
	r := &abuseRuntime{m: abuse.NewMetrics(reg)}
	if !a.enabled {
		log.Info("abuse detection off (--abuse-detection=false)")
		return r, nil
	}
	det, err := abuse.New(abuse.Options{Store: ctrl, Holder: holder, Config: a.cfg, Metrics: r.m, Logger: log})
	if err != nil {
		return nil, err
	}
	det.Start(ctx)
	r.det = det
	log.Info("abuse detection on", "interval", a.cfg.Interval, "window", a.cfg.Window, "threshold", a.cfg.Threshold,
		"min_requests", a.cfg.MinRequests, "multiplier", a.cfg.Multiplier, "penalty", a.cfg.Penalty, "max_penalties", a.cfg.MaxPenalties)
	return r, nil
}

// Close stops the detector and releases its lease, so that another node takes over at once.
func (r *abuseRuntime) Close() {
	if r.det != nil {
		r.det.Close()
	}
}

// CountOverrides wraps the store the admin API writes to, so that the overrides it creates
// count in sluice_overrides_applied_total as the detector's do.
func (r *abuseRuntime) CountOverrides(s control.Store) control.Store {
	return overrideCounter{Store: s, m: r.m}
}

// overrideCounter is a control.Store that counts the overrides created through it.
type overrideCounter struct {
	control.Store
	m *abuse.Metrics
}

// CreateOverride creates o and counts it.
func (s overrideCounter) CreateOverride(ctx context.Context, ch control.Change, o control.Override) (control.Override, error) {
	o, err := s.Store.CreateOverride(ctx, ch, o)
	if err == nil {
		s.m.OverrideApplied(o.Type, o.Source)
	}
	return o, err
}

// Import passes a bulk import to the store (control.Importer): the wrapper must not hide it.
// Imported overrides are the operator's bundle, not new penalties: they are not counted.
func (s overrideCounter) Import(ctx context.Context, ch control.Change, b *control.Bundle, apply bool) (control.ImportResult, error) {
	im, ok := s.Store.(control.Importer)
	if !ok {
		return control.ImportResult{}, fmt.Errorf("control store %T cannot import", s.Store)
	}
	return im.Import(ctx, ch, b, apply)
}
