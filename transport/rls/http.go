package rls

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/telemetry/tracing"
)

// DefaultMaxJSONBody caps a /json request body, as the HTTP API caps its own: a
// RateLimitRequest is a few hundred bytes.
const DefaultMaxJSONBody = 64 << 10

// JSONHandler serves the reference service's HTTP endpoint /json, for callers that cannot
// speak gRPC (Lua filters, scripts): the body is a RateLimitRequest in protobuf's JSON mapping
// ({"domain": "edge", "descriptors": [{"entries": [{"key": "client_id", "value": "c1"}]}]};
// field names as in the .proto or in lowerCamelCase), decided exactly as ShouldRateLimit
// decides it over gRPC, and the answer is the RateLimitResponse in the same mapping
// ({"overallCode": "OVER_LIMIT", "statuses": [...]}).
//
// Status codes follow the reference: 200 when the overall code is OK, 429 when OVER_LIMIT,
// 400 for a body that is not a valid request. Two differences, both to say more: the 400 body
// is {"error": "..."} rather than "Bad Request", and a decision the store could not make is
// 503 rather than 400. Like the reference it takes any method. Decisions count in the metrics
// as api="rls". Bodies over maxBody bytes (DefaultMaxJSONBody when 0 or less) are 413.
//
// This is a compatibility endpoint, not a hot path: protojson allocates freely. Native HTTP
// callers should use POST /v1/check.
func (s *Server) JSONHandler(maxBody int64) http.Handler {
	if maxBody <= 0 {
		maxBody = DefaultMaxJSONBody
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				s.m.Rejected(api, "invalid")
				writeJSONError(w, http.StatusRequestEntityTooLarge, "request body larger than the limit")
				return
			}
			writeJSONError(w, http.StatusBadRequest, "read body: "+err.Error())
			return
		}
		var req rlsv3.RateLimitRequest
		// protojson refuses unknown and repeated fields, as the reference (which uses it too)
		// does.
		if err := protojson.Unmarshal(body, &req); err != nil {
			s.m.Rejected(api, "invalid")
			writeJSONError(w, http.StatusBadRequest, "RateLimitRequest: "+err.Error())
			return
		}
		ctx, sp := s.o.Tracer.StartHTTP(r.Context(), r.Header, api, tracing.CheckSpan)
		resp, err := s.decide(ctx, &req, sp)
		if err != nil {
			writeJSONError(w, httpStatus(err), status.Convert(err).Message())
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			writeJSONError(w, http.StatusInternalServerError, "encode RateLimitResponse: "+err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch resp.GetOverallCode() {
		case rlsv3.RateLimitResponse_OK:
		case rlsv3.RateLimitResponse_OVER_LIMIT:
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			w.WriteHeader(http.StatusInternalServerError)
		}
		w.Write(out)
	})
}

// httpStatus maps ShouldRateLimit's gRPC error to an HTTP status: bad input is 400; anything
// else is a decision that could not be made, 503 as in the HTTP API.
func httpStatus(err error) int {
	if status.Code(err) == codes.InvalidArgument {
		return http.StatusBadRequest
	}
	return http.StatusServiceUnavailable
}

func writeJSONError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// Healthcheck serves the reference service's GET /healthcheck: 200 with the body "OK" while
// the process serves, 500 once Fail is called. The command calls Fail when shutdown begins,
// as the reference does on SIGTERM, so that load balancers which probe this path stop sending
// before the listeners close. The zero value is healthy and ready to use.
type Healthcheck struct {
	// Check, when set, is asked on every probe: an error answers 500 with it
	// (REDIS_HEALTH_CHECK_ACTIVE_CONNECTION: the store must answer). Set it before serving.
	Check func(context.Context) error

	failed atomic.Bool
}

// Fail makes every later answer 500. It cannot be undone: it marks the end of the process.
func (h *Healthcheck) Fail() { h.failed.Store(true) }

// ServeHTTP answers the probe.
func (h *Healthcheck) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Cache-Control", "no-store")
	if h.failed.Load() {
		w.WriteHeader(http.StatusInternalServerError)
		w.Write([]byte("shutting down"))
		return
	}
	if h.Check != nil {
		if err := h.Check(r.Context()); err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte(err.Error()))
			return
		}
	}
	w.Write([]byte("OK"))
}
