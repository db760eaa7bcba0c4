package testutil

import "net/http"

// DiscardWriter is an http.ResponseWriter that keeps one header map and the status and drops
// the body, so that a benchmark which clears the header between requests counts the handler's
// allocations rather than httptest.ResponseRecorder's copies.
type DiscardWriter struct {
	h http.Header
	// Code is the status given to WriteHeader: 0 when the handler gave none (an implicit 200).
	Code int
}

// NewDiscardWriter returns a DiscardWriter with an empty header.
func NewDiscardWriter() *DiscardWriter { return &DiscardWriter{h: http.Header{}} }

// Header returns the one header map.
func (d *DiscardWriter) Header() http.Header { return d.h }

// Write drops b.
func (d *DiscardWriter) Write(b []byte) (int, error) { return len(b), nil }

// WriteHeader keeps code.
func (d *DiscardWriter) WriteHeader(code int) { d.Code = code }
