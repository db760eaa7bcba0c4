package grpcapi

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestReserveCommitRelease: Reserve, Commit and Release over a real connection: the estimate
// is taken, the unused part given back, a repeat answers as the first, a denial has no lease,
// and bad or foreign settlements are InvalidArgument or NotFound, nothing changed.
func TestReserveCommitRelease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testPolicy)
	ctx := context.Background()
	left := func() int64 {
		t.Helper()
		d, err := e.client.GetQuota(ctx, &sluicev1.CheckRequest{Tenant: "t", User: "res"})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range d.GetResults() {
			if r.GetRule() == "per-user" {
				return r.GetRemaining()
			}
		}
		t.Fatal("no per-user result")
		return 0
	}
	check := &sluicev1.CheckRequest{Tenant: "t", User: "res", Cost: proto.Int64(3)}
	res, err := e.client.Reserve(ctx, &sluicev1.ReserveRequest{Check: check, TtlMs: 30_000})
	if err != nil || !strings.HasPrefix(res.GetLease(), "ls_") || res.GetReserved() != 3 || !res.GetDecision().GetAllowed() || res.GetExpiresAtMs() == 0 {
		t.Fatalf("reserve: %v, %v", res, err)
	}
	if got := left(); got != 0 {
		t.Fatalf("after reserving 3 of 3: %d left", got)
	}
	denied, err := e.client.Reserve(ctx, &sluicev1.ReserveRequest{Check: &sluicev1.CheckRequest{Tenant: "t", User: "res"}})
	if err != nil || denied.GetLease() != "" || denied.GetDecision().GetAllowed() {
		t.Fatalf("reserve past the limit: %v, %v", denied, err)
	}
	for _, c := range []struct {
		name string
		in   *sluicev1.CommitRequest
		code codes.Code
	}{
		{"negative used", &sluicev1.CommitRequest{Tenant: "t", Lease: res.GetLease(), Used: -1}, codes.InvalidArgument},
		{"malformed lease", &sluicev1.CommitRequest{Tenant: "t", Lease: "x", Used: 1}, codes.InvalidArgument},
		{"another tenant", &sluicev1.CommitRequest{Tenant: "u", Lease: res.GetLease(), Used: 0}, codes.NotFound},
	} {
		if _, err := e.client.Commit(ctx, c.in); status.Code(err) != c.code {
			t.Errorf("%s: %v, want %s", c.name, err, c.code)
		}
	}
	if got := left(); got != 0 {
		t.Fatalf("after refused settlements: %d left", got)
	}
	if rn, err := e.client.Renew(ctx, &sluicev1.RenewRequest{Tenant: "t", Lease: res.GetLease(), TtlMs: 60_000}); err != nil || rn.GetExpiresAtMs() == 0 {
		t.Fatalf("renew: %v, %v", rn, err)
	}
	if _, err := e.client.Renew(ctx, &sluicev1.RenewRequest{Tenant: "u", Lease: res.GetLease()}); status.Code(err) != codes.NotFound {
		t.Fatalf("renew another tenant's lease: %v", err)
	}
	st, err := e.client.Commit(ctx, &sluicev1.CommitRequest{Tenant: "t", Lease: res.GetLease(), Used: 1})
	if err != nil || st.GetRepeated() || st.GetUsed() != 1 || left() != 2 {
		t.Fatalf("commit 1 of 3: %v, %v, %d left", st, err, left())
	}
	st, err = e.client.Release(ctx, &sluicev1.ReleaseRequest{Tenant: "t", Lease: res.GetLease()})
	if err != nil || !st.GetRepeated() || st.GetUsed() != 1 || left() != 2 {
		t.Fatalf("release after commit: %v, %v, %d left", st, err, left())
	}
	if _, err := e.client.Renew(ctx, &sluicev1.RenewRequest{Tenant: "t", Lease: res.GetLease()}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("renew a settled lease: %v", err)
	}
	if _, err := e.client.Reserve(ctx, &sluicev1.ReserveRequest{Check: check, TtlMs: 7_200_000}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "ttl_ms") {
		t.Fatalf("a 2h lease: %v", err)
	}
}

// TestConcurrencySlots: over gRPC, a reservation takes a slot of a concurrency limit, the
// results say how many are in flight, a second is refused while the first is held, and a
// release frees it.
func TestConcurrencySlots(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "rules:\n  - {name: jobs, key: [user], algorithm: concurrency, limit: 1}\n")
	ctx := context.Background()
	check := &sluicev1.CheckRequest{Tenant: "t", User: "slots"}
	res, err := e.client.Reserve(ctx, &sluicev1.ReserveRequest{Check: check, TtlMs: 30_000})
	if err != nil || res.GetLease() == "" || res.GetDecision().GetResults()[0].GetInFlight() != 1 {
		t.Fatalf("reserve a slot: %v, %v", res, err)
	}
	if again, err := e.client.Reserve(ctx, &sluicev1.ReserveRequest{Check: check}); err != nil || again.GetLease() != "" || again.GetDecision().GetAllowed() {
		t.Fatalf("a second slot of 1: %v, %v", again, err)
	}
	if _, err := e.client.Release(ctx, &sluicev1.ReleaseRequest{Tenant: "t", Lease: res.GetLease()}); err != nil {
		t.Fatal(err)
	}
	q, err := e.client.GetQuota(ctx, check)
	if err != nil || q.GetResults()[0].GetInFlight() != 0 || q.GetRemaining() != 1 {
		t.Fatalf("after the release: %v, %v", q, err)
	}
}
