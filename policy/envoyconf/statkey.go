package envoyconf

// setTrail records what the limit needs of its ancestors' nodes: the share_threshold pattern
// of each level (when any level shares) and, when its stats are named per request value, the
// nodes themselves.
func (l *Limit) setTrail(trail []*node) {
	shares, perValue := false, l.DetailedMetric
	for _, n := range trail {
		shares = shares || n.share
		perValue = perValue || n.toMetric
	}
	if shares {
		l.shared = make([]string, len(trail))
		for i, n := range trail {
			if n.share {
				l.shared[i] = n.value
			}
		}
	}
	if perValue {
		l.trail = trail
	}
}

// PerValueStats reports whether the limit's stats are named by the request's values
// (detailed_metric on the limit, or value_to_metric on a level of its path), so that
// AppendStatKey must be asked per request; otherwise the name is always StatKey.
func (l *Limit) PerValueStats() bool { return l.trail != nil }

// AppendStatKey appends to b the reference service's stats key of a request that matched the
// limit with entries (src/config/config_impl.go, GetLimit):
//
//   - detailed_metric: the domain, then every entry as key_value, the request's own value
//     ("key_" when it is empty); a level whose matched node has share_threshold writes its
//     wildcard pattern instead, and then an empty value writes the bare key;
//   - else value_to_metric: the domain, then per level key_value where the request's value
//     names it (a node with that value, or value_to_metric on a default or wildcard node),
//     the wildcard pattern where a wildcard node matched without value_to_metric or with
//     share_threshold, and the bare key where a default node matched without it;
//   - else StatKey.
//
// The key holds the request's values as sent: the caller escapes what its sink cannot carry.
func (l *Limit) AppendStatKey(b []byte, entries []Entry) []byte {
	if l.trail == nil || len(entries) != len(l.trail) {
		return append(b, l.StatKey...)
	}
	b = append(b, l.Domain...)
	if l.DetailedMetric {
		for i, e := range entries {
			b = append(b, '.')
			b = append(b, e.Key...)
			switch {
			case l.shared != nil && l.shared[i] != "":
				b = append(b, '_')
				b = append(b, l.shared[i]...)
			case l.shared != nil && e.Value == "":
			default:
				b = append(b, '_')
				b = append(b, e.Value...)
			}
		}
		return b
	}
	for i, e := range entries {
		n := l.trail[i]
		b = append(b, '.')
		b = append(b, e.Key...)
		value := ""
		switch {
		case n.glob != nil && (n.share || !n.toMetric):
			value = n.value
		case n.value != "" || n.toMetric:
			value = e.Value
		}
		if value != "" {
			b = append(b, '_')
			b = append(b, value...)
		}
	}
	return b
}
