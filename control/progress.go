package control

import "context"

// progressKey carries a Load's progress callback in its context.
type progressKey struct{}

// WithProgress returns a context under which a Store's Load calls f each time it has read a
// part of the state. A caller can then hold a deadline on progress rather than on the whole
// read: a store that is large but answers keeps being read, one that hangs stops calling f.
func WithProgress(ctx context.Context, f func()) context.Context {
	return context.WithValue(ctx, progressKey{}, f)
}

// ReportProgress calls the function that WithProgress put in ctx, if any. Stores call it as
// rows arrive; calling it too often costs only the call.
func ReportProgress(ctx context.Context) {
	if f, ok := ctx.Value(progressKey{}).(func()); ok {
		f()
	}
}
