package rls

import (
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/grpcdecode"
)

// Register adds the service to gs. Use it rather than rlsv3.RegisterRateLimitServiceServer: it
// also answers a request that does not decode (a string that is not valid UTF-8, which proto3
// rejects while unmarshalling) with InvalidArgument naming the field, where gRPC would answer
// Internal, a server fault, for the client's bad input, and decodes the requests Envoy sends
// through decodeRequest. It assumes gs decodes with the standard proto codec (no
// ForceServerCodec), as transport/grpcapi's Register does.
func (s *Server) Register(gs *grpc.Server) {
	grpcdecode.Register(gs, &rlsv3.RateLimitService_ServiceDesc, s, func() { s.m.Rejected(api, "invalid") }, decodeRequest)
}

// decodeRequest decodes the requests Envoy sends (a domain, descriptors of key/value entries,
// hits_addend) straight from the wire, a grpcdecode.Fast. Written by hand because protobuf's
// decoding, reflection-driven and one allocation per message and string, took a tenth of the
// server's time per call (docs/measurements.md), and no well-kept library generates
// a decoder for go-control-plane's types (they ship vtprotobuf's marshalling only). It counts
// the descriptors and entries first, then fills one array of each and takes every string from
// one copy of the request (BenchmarkDecodeRequest). It declines anything else (a limit
// override, a descriptor's own hits_addend, an unknown field or wire type, a string that is not
// UTF-8, a malformed message), which protobuf then decodes, or names the field of: it never
// decides what protobuf would decide otherwise (FuzzDecodeRequest holds it to proto.Unmarshal).
func decodeRequest(b []byte, m proto.Message) bool {
	req, ok := m.(*rlsv3.RateLimitRequest)
	if !ok {
		return false
	}
	ndesc, nentries, ok := countRequest(b)
	if !ok {
		return false
	}
	w := wire{b: b, s: string(b)}
	descs := make([]ratelimitv3.RateLimitDescriptor, ndesc)
	entries := make([]ratelimitv3.RateLimitDescriptor_Entry, nentries)
	ptrs := make([]*ratelimitv3.RateLimitDescriptor, ndesc)
	eptrs := make([]*ratelimitv3.RateLimitDescriptor_Entry, nentries)
	for i := range descs {
		ptrs[i] = &descs[i]
	}
	for i := range entries {
		eptrs[i] = &entries[i]
	}
	if ndesc > 0 {
		req.Descriptors = ptrs
	}
	d, e := 0, 0
	for i := 0; i < len(b); {
		num, typ, n := protowire.ConsumeTag(b[i:])
		i += n
		switch num {
		case 1:
			str, next, ok := w.str(i)
			if !ok {
				return false
			}
			req.Domain, i = str, next
		case 2:
			v, n := protowire.ConsumeBytes(b[i:])
			start := i + n - len(v)
			k := e
			for j := start; j < start+len(v); {
				_, _, tn := protowire.ConsumeTag(b[j:])
				ev, en := protowire.ConsumeBytes(b[j+tn:])
				if !w.entry(j+tn+en-len(ev), j+tn+en, entries[e:e+1]) {
					return false
				}
				e, j = e+1, j+tn+en
			}
			if e > k {
				descs[d].Entries = eptrs[k:e:e]
			}
			d, i = d+1, i+n
		default: // 3, checked by countRequest
			v, n := protowire.ConsumeVarint(b[i:])
			req.HitsAddend, i = uint32(v), i+n
			_ = typ
		}
	}
	return true
}

// countRequest checks the shape of a request decodeRequest takes and counts its descriptors
// and entries.
func countRequest(b []byte) (ndesc, nentries int, ok bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, 0, false
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			n = protowire.ConsumeFieldValue(num, typ, b)
		case num == 2 && typ == protowire.BytesType:
			var v []byte
			v, n = protowire.ConsumeBytes(b)
			for n >= 0 && len(v) > 0 {
				num, typ, tn := protowire.ConsumeTag(v)
				if tn < 0 || num != 1 || typ != protowire.BytesType {
					return 0, 0, false
				}
				en := protowire.ConsumeFieldValue(num, typ, v[tn:])
				if en < 0 {
					return 0, 0, false
				}
				v, nentries = v[tn+en:], nentries+1
			}
			ndesc++
		case num == 3 && typ == protowire.VarintType:
			_, n = protowire.ConsumeVarint(b)
		default:
			return 0, 0, false
		}
		if n < 0 {
			return 0, 0, false
		}
		b = b[n:]
	}
	return ndesc, nentries, true
}

// wire is a request's bytes and one string copy of them, which its strings are taken from.
type wire struct {
	b []byte
	s string
}

// str reads the length-delimited UTF-8 string at b[i:] and the offset after it.
func (w wire) str(i int) (string, int, bool) {
	v, n := protowire.ConsumeBytes(w.b[i:])
	if n < 0 || !utf8.Valid(v) {
		return "", 0, false
	}
	end := i + n
	return w.s[end-len(v) : end], end, true
}

// entry decodes the entry in b[start:end] into e[0].
func (w wire) entry(start, end int, e []ratelimitv3.RateLimitDescriptor_Entry) bool {
	for i := start; i < end; {
		num, typ, n := protowire.ConsumeTag(w.b[i:end])
		if n < 0 || typ != protowire.BytesType || num != 1 && num != 2 {
			return false
		}
		v, m := protowire.ConsumeBytes(w.b[i+n : end])
		if m < 0 || !utf8.Valid(v) {
			return false
		}
		str := w.s[i+n+m-len(v) : i+n+m]
		if num == 1 {
			e[0].Key = str
		} else {
			e[0].Value = str
		}
		i += n + m
	}
	return true
}
