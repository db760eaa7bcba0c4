package grpcapi

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/policy"
)

// Reserve decides like Check with the cost the estimate and, when allowed, issues a lease
// (sluice.Limiter.Reserve). A denial is an answer with no lease.
func (s *Server) Reserve(ctx context.Context, in *sluicev1.ReserveRequest) (*sluicev1.ReserveResponse, error) {
	start := time.Now()
	var r policy.Request
	look, err := requestOf(in.GetCheck(), &r)
	if err == nil && look {
		err = &policy.FieldError{Field: "check.cost", Msg: "must be >= 1 for a reservation (the estimate); use GetQuota to look"}
	}
	if err == nil && (in.GetTtlMs() < 0 || in.GetTtlMs() > sluice.MaxLeaseTTL.Milliseconds()) {
		err = &policy.FieldError{Field: "ttl_ms", Msg: "must be from 0 (the default, 60000) to 3600000"}
	}
	if err != nil {
		return nil, s.fail(err)
	}
	d := s.decisions.Get().(*sluice.Decision)
	defer s.decisions.Put(d)
	lease, err := s.l.Reserve(ctx, &r, time.Duration(in.GetTtlMs())*time.Millisecond, d)
	if err != nil {
		return nil, s.fail(err)
	}
	s.m.ObserveCheck(api, d, time.Since(start))
	s.m.ObserveSlots(d)
	s.events.Check(&r, d)
	out := &sluicev1.ReserveResponse{Decision: responseOf(d)}
	if lease != nil {
		s.m.LeaseReserved()
		out.Lease, out.Reserved, out.ExpiresAtMs = lease.ID, lease.Reserved, lease.ExpiresAt.UnixMilli()
	}
	return out, nil
}

// Commit settles a lease with what the work used (sluice.Limiter.Commit).
func (s *Server) Commit(ctx context.Context, in *sluicev1.CommitRequest) (*sluicev1.CommitResponse, error) {
	return s.settle(ctx, in.GetTenant(), in.GetLease(), in.GetUsed())
}

// Release settles a lease with nothing used.
func (s *Server) Release(ctx context.Context, in *sluicev1.ReleaseRequest) (*sluicev1.CommitResponse, error) {
	return s.settle(ctx, in.GetTenant(), in.GetLease(), 0)
}

// Renew sets an unsettled lease's expiry to ttl_ms from now (sluice.Limiter.Renew).
func (s *Server) Renew(ctx context.Context, in *sluicev1.RenewRequest) (*sluicev1.RenewResponse, error) {
	ttl := sluice.DefaultLeaseTTL
	if in.GetTtlMs() != 0 {
		ttl = time.Duration(in.GetTtlMs()) * time.Millisecond
	}
	if in.GetTtlMs() < 0 || ttl > sluice.MaxLeaseTTL {
		return nil, s.fail(&policy.FieldError{Field: "ttl_ms", Msg: "must be from 0 (the default, 60000) to 3600000"})
	}
	if err := s.l.Renew(ctx, in.GetTenant(), in.GetLease(), ttl); err != nil {
		switch {
		case errors.Is(err, sluice.ErrUnknownLease):
			s.m.Rejected(api, "unknown_lease")
			return nil, status.Error(codes.NotFound, err.Error())
		case errors.Is(err, sluice.ErrLeaseSettled):
			s.m.Rejected(api, "lease_settled")
			return nil, status.Error(codes.FailedPrecondition, err.Error())
		}
		return nil, s.fail(err)
	}
	return &sluicev1.RenewResponse{Lease: in.GetLease(), ExpiresAtMs: time.Now().Add(ttl).UnixMilli()}, nil
}

func (s *Server) settle(ctx context.Context, tenant, lease string, used int64) (*sluicev1.CommitResponse, error) {
	st, err := s.l.Commit(ctx, tenant, lease, used)
	if err != nil {
		if errorsIsUnknownLease(err) {
			s.m.Rejected(api, "unknown_lease")
			return nil, status.Error(codes.NotFound, err.Error())
		}
		return nil, s.fail(err)
	}
	if !st.Repeated {
		s.m.LeaseSettled(st.Reserved, st.Used, st.Slots)
	}
	return &sluicev1.CommitResponse{Lease: st.Lease, Reserved: st.Reserved, Used: st.Used, Repeated: st.Repeated}, nil
}

func errorsIsUnknownLease(err error) bool { return errors.Is(err, sluice.ErrUnknownLease) }
