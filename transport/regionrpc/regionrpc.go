// Package regionrpc carries a region's sync over gRPC: the sluice.v1.Regions service that the
// other regions call (Sync, Decide), the links this node calls them through, the region token
// both sides check, and the region metrics (docs/architecture.md, Regions). The sync itself,
// what is sent and how it is merged and decided, is store/region's; this package converts
// between its messages and the protos.
package regionrpc

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/store/region"
)

// Options are the transport's settings: the serve flags --region-ca and --region-token-file.
type Options struct {
	// TLS, when set, is the client configuration for peers (--region-ca); nil is plaintext.
	TLS *tls.Config
	// Token is the secret every region's nodes share (--region-token-file): sent with every
	// call to a peer, and required of every call to this node's Regions service. At least
	// MinTokenLen bytes and MinTokenBits of entropy.
	Token string
	// OnAuthFailure, when set, is told of each call refused for its region token, with the
	// reason ("invalid", or "limited": from an address past its failures): the node counts
	// them beside the admin API's (sluice_admin_auth_failures_total).
	OnAuthFailure func(reason string)
	// Log receives refused calls (default slog.Default()).
	Log *slog.Logger
	// Now is the clock of the failed-authentication limit (default time.Now); tests drive it.
	Now func() time.Time
}

// Transport is the gRPC side of one node's Region: it serves the Regions service over the
// Region (Register), makes its links to the peers (Dial, for Region.Start) and exports its
// metrics (a prometheus.Collector).
type Transport struct {
	r    *region.Region
	opts Options
	// guard limits, counts and logs failed region authentications.
	guard *authGuard
}

// New returns the transport of r. It refuses a region token too short or too predictable.
func New(r *region.Region, opts Options) (*Transport, error) {
	if err := CheckToken(opts.Token); err != nil {
		return nil, err
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Transport{r: r, opts: opts, guard: newAuthGuard()}, nil
}
