// Package grpcdecode makes a gRPC service answer a request message that does not decode with
// InvalidArgument naming the field, where gRPC would answer Internal, a server fault, for the
// client's bad input. transport/grpcapi and transport/rls register through it, so both name a field
// the same way (descriptors[0].entries[1].value, descriptors.k).
package grpcdecode

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sluicehq/sluice/policy"
)

// Register registers impl on gs under a copy of desc whose unary handlers decode strictly:
// a request that does not decode (a string that is not valid UTF-8, which proto3 rejects while
// unmarshalling, or a malformed message) is InvalidArgument naming the field, and rejected
// (which may be nil) is called for it. It assumes gs decodes with the standard proto codec (no
// ForceServerCodec).
// With fast, a request is first decoded by fast (see Fast), and by protobuf when fast declines.
func Register(gs grpc.ServiceRegistrar, desc *grpc.ServiceDesc, impl any, rejected func(), fast ...Fast) {
	d := *desc
	d.Methods = slices.Clone(d.Methods) // the generated desc is shared; never edit it
	var f Fast
	if len(fast) > 0 {
		f = fast[0]
	}
	for i := range d.Methods {
		d.Methods[i].Handler = decodeErrors(d.Methods[i].Handler, rejected, f)
	}
	gs.RegisterService(&d, impl)
}

// Fast decodes the wire form b into m, a fresh request message, and reports whether it did.
// It may decline any input (leaving m in any state): protobuf then decodes b into m afresh and
// names the field of a bad request. It must never accept what protobuf would decode otherwise
// or refuse.
type Fast func(b []byte, m proto.Message) bool

// decodeErrors wraps a generated handler so that a request message that does not decode is
// InvalidArgument. The handler's dec sends its own status to the client when the codec fails,
// before the handler can return another, so the codec must not fail: dec is given a
// rawRequest, whose Unmarshal decodes the real message and keeps the error for us.
func decodeErrors(h grpc.MethodHandler, rejected func(), fast Fast) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		strict := func(m any) error {
			pm, ok := m.(proto.Message)
			if !ok {
				return dec(m)
			}
			raw := rawRequest{m: pm, fast: fast}
			if err := dec(&raw); err != nil {
				return err // transport errors: oversized, cancelled, bad compression
			}
			if raw.err != nil {
				if rejected != nil {
					rejected()
				}
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
	m    proto.Message
	fast Fast
	err  error
}

func (r *rawRequest) Reset()         { proto.Reset(r.m) }
func (r *rawRequest) String() string { return fmt.Sprint(r.m) } // what a stats handler logs
func (r *rawRequest) ProtoMessage()  {}

// Unmarshal decodes b into the real message. It never fails, so that the codec does not
// answer Internal on its own; the error is kept in r.err.
func (r *rawRequest) Unmarshal(b []byte) error {
	if r.fast != nil && r.fast(b, r.m) {
		return nil
	}
	if err := proto.Unmarshal(b, r.m); err != nil { // it resets what fast left
		if field := InvalidUTF8Field(r.m.ProtoReflect().Descriptor(), b); field != "" {
			r.err = &policy.FieldError{Field: field, Msg: "not valid UTF-8"}
		} else {
			r.err = fmt.Errorf("%w: malformed request: %w", policy.ErrInvalid, err)
		}
	}
	return nil
}

// maxDepth bounds the recursion of InvalidUTF8Field on hostile input: the deepest request
// served nests three levels (an RLS request, its descriptor, the descriptor's entry).
const maxDepth = 4

// InvalidUTF8Field returns the path of the first string field of the wire-form message b, of
// type md, that is not valid UTF-8, or "" when there is none or b does not parse. An element
// of a repeated field is named by its index (descriptors[0].entries[1].value), a value of a
// string-keyed map by its key (descriptors.k, as policy.Request's validation names it), and a
// map key that is not UTF-8 by the map's name.
func InvalidUTF8Field(md protoreflect.MessageDescriptor, b []byte) string {
	return invalidUTF8Field(md, b, "", 0)
}

func invalidUTF8Field(md protoreflect.MessageDescriptor, b []byte, prefix string, depth int) string {
	if depth >= maxDepth {
		return ""
	}
	var seen map[protowire.Number]int // index of the next element of each repeated field
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok {
			return ""
		}
		b = rest
		fd := md.Fields().ByNumber(f.num)
		if !f.bytes || fd == nil {
			continue // only a length-delimited field can hold a string
		}
		path := prefix + string(fd.Name())
		switch {
		case fd.IsMap():
			if p := invalidUTF8Entry(fd, f.v, path, depth+1); p != "" {
				return p
			}
			continue
		case fd.Cardinality() == protoreflect.Repeated:
			if seen == nil {
				seen = map[protowire.Number]int{}
			}
			path += "[" + strconv.Itoa(seen[f.num]) + "]"
			seen[f.num]++
		}
		switch {
		case fd.Kind() == protoreflect.MessageKind:
			if p := invalidUTF8Field(fd.Message(), f.v, path+".", depth+1); p != "" {
				return p
			}
		case fd.Kind() == protoreflect.StringKind && !utf8.Valid(f.v):
			return path
		}
	}
	return ""
}

// invalidUTF8Entry is invalidUTF8Field for the wire-form entry b of the map field fd, named
// path. The key is read first, wherever it stands on the wire, because it names the value.
func invalidUTF8Entry(fd protoreflect.FieldDescriptor, b []byte, path string, depth int) string {
	if depth >= maxDepth {
		return ""
	}
	keyFd, valFd := fd.MapKey(), fd.MapValue()
	name := path
	for rest := b; len(rest) > 0; {
		f, r, ok := next(rest)
		if !ok {
			return ""
		}
		rest = r
		if !f.bytes || f.num != keyFd.Number() || keyFd.Kind() != protoreflect.StringKind {
			continue
		}
		if !utf8.Valid(f.v) {
			return path // a key that is not text cannot be printed in the name
		}
		// An empty key, or one too long to repeat in a message, names the map alone.
		name = path
		if len(f.v) > 0 && len(f.v) <= policy.MaxAttribute {
			name = path + "." + string(f.v)
		}
	}
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok {
			return ""
		}
		b = rest
		if !f.bytes || f.num != valFd.Number() {
			continue
		}
		switch {
		case valFd.Kind() == protoreflect.MessageKind:
			if p := invalidUTF8Field(valFd.Message(), f.v, name+".", depth+1); p != "" {
				return p
			}
		case valFd.Kind() == protoreflect.StringKind && !utf8.Valid(f.v):
			return name
		}
	}
	return ""
}

// field is one field read off the front of a wire-form message.
type field struct {
	num   protowire.Number
	bytes bool   // length-delimited (a string, bytes, a message, a packed list)
	v     []byte // its contents, when bytes
}

// next reads one field off the front of b and returns the rest; ok is false when b does not
// parse.
func next(b []byte) (f field, rest []byte, ok bool) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return field{}, nil, false
	}
	b = b[n:]
	if typ != protowire.BytesType {
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return field{}, nil, false
		}
		return field{num: num}, b[n:], true
	}
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return field{}, nil, false
	}
	return field{num: num, bytes: true, v: v}, b[n:], true
}
