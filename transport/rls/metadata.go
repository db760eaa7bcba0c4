package rls

import (
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice"
)

// dynamicMetadata is the answer's dynamic_metadata as the reference service builds it with
// RESPONSE_DYNAMIC_METADATA=true (Options.DynamicMetadata): the request's domain, its
// descriptors (entries as "key=value", a per-request limit as its text, a descriptor's
// hitsAddend), the request's hitsAddend when not 0, and under "metadata" the metadata of the
// limits of the descriptors that passed (OK, not unlimited), merged in their order: a key
// already present keeps its value, two mappings under one key merge.
func dynamicMetadata(in *rlsv3.RateLimitRequest, d *sluice.DescriptorDecision) (*structpb.Struct, error) {
	descs := make([]*structpb.Value, 0, len(in.GetDescriptors()))
	for _, desc := range in.GetDescriptors() {
		if desc == nil {
			continue
		}
		entries := make([]*structpb.Value, 0, len(desc.GetEntries()))
		for _, e := range desc.GetEntries() {
			entries = append(entries, structpb.NewStringValue(e.GetKey()+"="+e.GetValue()))
		}
		fields := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if desc.GetLimit() != nil {
			fields["limit"] = structpb.NewStringValue(desc.GetLimit().String())
		}
		if h := desc.GetHitsAddend(); h != nil {
			fields["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: fields}))
	}
	out := &structpb.Struct{Fields: map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(in.GetDomain()),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descs}),
	}}
	if h := in.GetHitsAddend(); h != 0 {
		out.Fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range d.Statuses {
		st := &d.Statuses[i]
		if !st.OK || st.Unlimited || st.Limit == nil || st.Limit.Metadata == nil {
			continue
		}
		md, err := structpb.NewStruct(st.Limit.Metadata)
		if err != nil {
			return nil, fmt.Errorf("metadata of %s: %w", st.Limit.ID, err)
		}
		mergeMetadata(passed, md)
	}
	if len(passed.Fields) > 0 {
		out.Fields["metadata"] = structpb.NewStructValue(passed)
	}
	return out, nil
}

// mergeMetadata adds src's fields to dst: a new key is added, a mapping under a key both hold
// is merged into, and anything else keeps dst's value.
func mergeMetadata(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = v
			continue
		}
		if hs, vs := have.GetStructValue(), v.GetStructValue(); hs != nil && vs != nil {
			mergeMetadata(hs, vs)
		}
	}
}
