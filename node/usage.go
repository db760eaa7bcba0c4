package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/telemetry/usage"
)

// UsageWriter returns the control store as the decision recorder's writer: telemetry declares
// the one method it needs and never imports the control plane, so the two meet here.
func UsageWriter(st control.Store) usage.Writer { return usageWriter{st} }

type usageWriter struct{ st control.Store }

func (w usageWriter) WriteCounts(ctx context.Context, u []usage.UsageCount, v []usage.ViolationCount) error {
	uc := make([]control.UsageCount, len(u))
	for i, c := range u {
		uc[i] = control.UsageCount{Minute: c.Minute, Rule: c.Rule, Tenant: c.Tenant,
			Allowed: c.Allowed, Denied: c.Denied, Soft: c.Soft}
	}
	vc := make([]control.ViolationCount, len(v))
	for i, c := range v {
		vc[i] = control.ViolationCount{Minute: c.Minute, Rule: c.Rule, Tenant: c.Tenant, User: c.User,
			APIKey: c.APIKey, IP: c.IP, Endpoint: c.Endpoint, Denied: c.Denied, Soft: c.Soft, Limit: c.Limit}
	}
	err := w.st.AddCounts(ctx, uc, vc)
	if errors.Is(err, control.ErrInvalid) {
		return fmt.Errorf("%w: %w", usage.ErrRefused, err)
	}
	return err
}
