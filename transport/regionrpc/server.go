package regionrpc

import (
	"context"
	"errors"
	"math"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/region"
)

// Register adds the sluice.v1.Regions service to s.
func (t *Transport) Register(s *grpc.Server) { sluicev1.RegisterRegionsServer(s, &server{t: t}) }

type server struct {
	sluicev1.UnimplementedRegionsServer
	t *Transport
}

// statusOf turns the Region's refusal of a message into the call's status: a field that does
// not check is InvalidArgument naming it, an idempotency key used for other ops
// FailedPrecondition, anything else (the home's store failing) Unavailable.
func statusOf(err error) error {
	var fe *region.FieldError
	switch {
	case errors.As(err, &fe):
		return status.Errorf(codes.InvalidArgument, "%s: %s", fe.Field, fe.Msg)
	case errors.Is(err, store.ErrIdempotencyMismatch):
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}

// Sync merges a peer's counts (region.Region.Receive), once the call's token checks.
func (s *server) Sync(ctx context.Context, req *sluicev1.SyncRequest) (*sluicev1.SyncResponse, error) {
	if err := s.t.authorize(ctx); err != nil {
		return nil, err
	}
	if err := s.t.r.Receive(syncFromProto(req)); err != nil {
		return nil, statusOf(err)
	}
	return &sluicev1.SyncResponse{Region: s.t.r.Name(), SentAtUs: req.GetSentAtUs()}, nil
}

// Decide applies the ops of rules homed in this region for another region
// (region.Region.Decide), once the call's token checks.
func (s *server) Decide(ctx context.Context, req *sluicev1.DecideRequest) (*sluicev1.DecideResponse, error) {
	if err := s.t.authorize(ctx); err != nil {
		return nil, err
	}
	resp, err := s.t.r.Decide(ctx, decideFromProto(req))
	if err != nil {
		return nil, statusOf(err)
	}
	return decideResponseToProto(resp), nil
}

var (
	peerUpDesc = prometheus.NewDesc("sluice_region_peer_up",
		"1 when the region was heard from within --region-timeout, 0 while it is silent (its last rate is assumed meanwhile).", []string{"region"}, nil)
	inboxLostDesc = prometheus.NewDesc("sluice_region_inbox_lost_total",
		"Syncs this node received that did not reach the region's inbox, by reason (queue_full, append_failed): merged here only until the sender's next full send (30 s).", []string{"reason"}, nil)
	inboxSkippedDesc = prometheus.NewDesc("sluice_region_inbox_skipped_total",
		"Records read from the region's inbox that did not read or check, skipped whole.", nil, nil)
	lagDesc = prometheus.NewDesc("sluice_region_lag_seconds",
		"Age of the newest counts held from the region: time since its last sync arrived plus the measured one-way delay.", []string{"region"}, nil)
)

// Describe is prometheus.Collector's.
func (t *Transport) Describe(ch chan<- *prometheus.Desc) {
	ch <- peerUpDesc
	ch <- lagDesc
	if t.r.Stats().Inbox {
		ch <- inboxLostDesc
		ch <- inboxSkippedDesc
	}
}

// Collect is prometheus.Collector's: sluice_region_peer_up and sluice_region_lag_seconds per
// peer, as of the scrape, and with an inbox its losses and skipped records.
func (t *Transport) Collect(ch chan<- prometheus.Metric) {
	st := t.r.Stats()
	for _, p := range st.Peers {
		up := 0.0
		if p.Up {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(peerUpDesc, prometheus.GaugeValue, up, p.Name)
		lag := math.Inf(1)
		if !p.LastReport.IsZero() {
			lag = p.Lag.Seconds()
		}
		ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, lag, p.Name)
	}
	if st.Inbox {
		ch <- prometheus.MustNewConstMetric(inboxLostDesc, prometheus.CounterValue, float64(st.InboxLostQueue), "queue_full")
		ch <- prometheus.MustNewConstMetric(inboxLostDesc, prometheus.CounterValue, float64(st.InboxLostAppend), "append_failed")
		ch <- prometheus.MustNewConstMetric(inboxSkippedDesc, prometheus.CounterValue, float64(st.InboxSkipped))
	}
}
