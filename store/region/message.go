package region

import (
	"context"
	"fmt"
	"time"
)

// SyncMessage is one sync from a region to another: the sender's counts of global keys. It
// carries what sluice.v1.SyncRequest carries; the transport converts between the two.
type SyncMessage struct {
	// Region is the sender's region name.
	Region string
	// SentAtUs is the sender's clock when it read the counts (µs since the Unix epoch).
	SentAtUs int64
	// SyncIntervalUs is the sender's --region-sync (µs).
	SyncIntervalUs int64
	// Counts are the counts that changed since the sender's last delivery (all of them in a
	// full send).
	Counts []WindowCount
}

// WindowCount is one key's count in one window of the sender's region.
type WindowCount struct {
	// Key is the bucket key, the same in every region.
	Key []byte
	// WindowStartUs is the start of the window (µs since the Unix epoch).
	WindowStartUs int64
	// Count is what the sender's region admitted in the window: grow-only.
	Count int64
	// Rate is the sender's recent admission rate of the key, per second; -1 when the count
	// comes without one (a sliding window's previous window).
	Rate float64
}

// DecideRequest asks the home region of rules with regions: home:NAME to decide ops in its
// store, as one batch. It carries what sluice.v1.DecideRequest carries.
type DecideRequest struct {
	// Region is the region the sender takes the receiver for: a mismatch is refused.
	Region string
	// Ops are decided as one batch.
	Ops []DecideOp
	// IdempotencyKey, when set, is the request's idempotency key as the sender's store keys
	// it; IdempotencyTTLMs is how long the home keeps the record (> 0 with a key).
	IdempotencyKey   []byte
	IdempotencyTTLMs int64
}

// DecideOp is one op of a DecideRequest: the key, its rule's parameters and the cost.
type DecideOp struct {
	Key       []byte
	Algorithm string // the algorithm's name, such as fixed_window
	Limit     int64
	Burst     int64
	PeriodUs  int64
	Cost      int64
	Shadow    bool
}

// DecideResponse is the home region's answer to a DecideRequest.
type DecideResponse struct {
	// Results are the ops' results, in order.
	Results []OpResult
	// Replayed is set when the results are those remembered for the idempotency key.
	Replayed bool
}

// OpResult is one op's result as the home region decided it (µs for the durations).
type OpResult struct {
	Allowed             bool
	CostExceedsCapacity bool
	Remaining           int64
	ResetAfterUs        int64
	RetryAfterUs        int64
	DelayUs             int64
}

// Link is the decorator's connection to one other region: what it calls on a peer.
// transport/regionrpc implements it over gRPC (the sluice.v1.Regions service).
type Link interface {
	// Sync delivers msg to the peer; nil once the peer has merged it.
	Sync(ctx context.Context, msg *SyncMessage) error
	// Decide has the peer, the ops' home region, decide req. An answer that the idempotency
	// key was used for other ops is store.ErrIdempotencyMismatch.
	Decide(ctx context.Context, req *DecideRequest) (*DecideResponse, error)
	// Close releases the link; Stop calls it once the sync has stopped.
	Close() error
}

// LinkConfig is what a Dialer is told of the link it makes.
type LinkConfig struct {
	// Name and Addr are the peer's, from Config.Peers.
	Name, Addr string
	// Sync is the sync interval: a broken link is retried at least every half of it.
	Sync time.Duration
	// CallTimeout bounds a connection attempt, as it bounds each call.
	CallTimeout time.Duration
	// Ready is to be called each time the link becomes ready after it was not: the region
	// then syncs at once, so what a partition held back crosses on the heal. It never blocks.
	Ready func()
}

// Dialer makes the link to one peer. Start calls it once per peer.
type Dialer func(LinkConfig) (Link, error)

// FieldError is a message refused for one of its fields: the transport answers it as an
// invalid argument naming the field.
type FieldError struct {
	Field, Msg string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// invalid returns the FieldError of field.
func invalid(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}
