package region

import (
	"context"
	"crypto/subtle"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// MinTokenLen is the shortest region token New accepts: the token is all that keeps a stranger
// who reaches a node's gRPC port from sending counts or spending home-region quota.
const MinTokenLen = 16

// errUnauthenticated is all a caller without the region token learns.
var errUnauthenticated = status.Error(codes.Unauthenticated, "unauthenticated")

// tokenCredentials sends the region token with every call to a peer.
type tokenCredentials struct{ header string }

func (c tokenCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": c.header}, nil
}

// RequireTransportSecurity is false so that regions on a private network may link in
// plaintext; --region-ca turns TLS on, and serve warns when the token travels in clear.
func (c tokenCredentials) RequireTransportSecurity() bool { return false }

// authorize checks that the call carries the region token, in constant time.
func (r *Region) authorize(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		tok, ok := strings.CutPrefix(v, "Bearer ")
		if ok && subtle.ConstantTimeCompare([]byte(tok), []byte(r.cfg.Token)) == 1 {
			return nil
		}
	}
	return errUnauthenticated
}
