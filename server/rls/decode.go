package rls

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sluicehq/sluice/policy"
)

// Register adds the service to gs. Use it rather than rlsv3.RegisterRateLimitServiceServer: it
// also answers a request that does not decode (a string that is not valid UTF-8, which proto3
// rejects while unmarshalling) with InvalidArgument naming the field, where gRPC would answer
// Internal, a server fault, for the client's bad input. It assumes gs decodes with the
// standard proto codec (no ForceServerCodec), as server/grpcapi's Register does.
func (s *Server) Register(gs *grpc.Server) {
	desc := rlsv3.RateLimitService_ServiceDesc
	desc.Methods = slices.Clone(desc.Methods) // the generated desc is shared; never edit it
	for i := range desc.Methods {
		desc.Methods[i].Handler = s.decodeErrors(desc.Methods[i].Handler)
	}
	gs.RegisterService(&desc, s)
}

// decodeErrors wraps a generated handler so that a request message that does not decode is
// InvalidArgument. The handler's dec sends its own status to the client when the codec fails,
// before the handler can return another, so the codec must not fail: dec is given a
// rawRequest, whose Unmarshal decodes the real message and keeps the error for us.
func (s *Server) decodeErrors(h grpc.MethodHandler) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		strict := func(m any) error {
			pm, ok := m.(proto.Message)
			if !ok {
				return dec(m)
			}
			raw := rawRequest{m: pm}
			if err := dec(&raw); err != nil {
				return err // transport errors: oversized, cancelled, bad compression
			}
			if raw.err != nil {
				s.m.Rejected(api, "invalid")
				return status.Error(codes.InvalidArgument, raw.err.Error())
			}
			return nil
		}
		return h(srv, ctx, strict, ic)
	}
}

// rawRequest stands in for a request message in gRPC's proto codec. It is a legacy message
// (the protobuf-go API before v2): the codec hands its Unmarshal method the raw bytes, which
// no other hook sees, so a decode error can be reported with the field that caused it.
type rawRequest struct {
	m   proto.Message
	err error
}

func (r *rawRequest) Reset()         { proto.Reset(r.m) }
func (r *rawRequest) String() string { return fmt.Sprint(r.m) } // what a stats handler logs
func (r *rawRequest) ProtoMessage()  {}

// Unmarshal decodes b into the real message. It never fails, so that the codec does not
// answer Internal on its own; the error is kept in r.err.
func (r *rawRequest) Unmarshal(b []byte) error {
	if err := proto.Unmarshal(b, r.m); err != nil {
		if field := invalidUTF8Field(r.m.ProtoReflect().Descriptor(), b, "", 0); field != "" {
			r.err = &policy.FieldError{Field: field, Msg: "not valid UTF-8"}
		} else {
			r.err = fmt.Errorf("%w: malformed request: %w", policy.ErrInvalid, err)
		}
	}
	return nil
}

// maxDepth bounds the recursion of invalidUTF8Field on hostile input: a RateLimitRequest nests
// three levels (request, descriptor, entry).
const maxDepth = 4

// invalidUTF8Field returns the path (such as descriptors[0].entries[1].value) of the first
// string field of the wire-form message b that is not valid UTF-8, or "" when there is none
// or b does not parse.
func invalidUTF8Field(md protoreflect.MessageDescriptor, b []byte, prefix string, depth int) string {
	if depth >= maxDepth {
		return ""
	}
	var seen map[protowire.Number]int // index of the next element of each repeated field
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return ""
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd == nil {
			continue
		}
		path := prefix + string(fd.Name())
		if fd.Cardinality() == protoreflect.Repeated {
			if seen == nil {
				seen = map[protowire.Number]int{}
			}
			path += "[" + strconv.Itoa(seen[num]) + "]"
			seen[num]++
		}
		switch {
		case fd.Kind() == protoreflect.MessageKind:
			if f := invalidUTF8Field(fd.Message(), v, path+".", depth+1); f != "" {
				return f
			}
		case fd.Kind() == protoreflect.StringKind && !utf8.Valid(v):
			return path
		}
	}
	return ""
}
