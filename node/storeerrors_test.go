package node

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/testutil"
)

// The first store error is logged at once; the next within storeErrorLogEvery only counted, and
// reported with the next line.
func TestStoreErrorLog(t *testing.T) {
	var buf bytes.Buffer
	clock := testutil.NewClock()
	s := &storeErrorLog{log: slog.New(slog.NewTextHandler(&buf, nil)), now: clock.Now}
	s.record(errors.New("first"))
	for range 5 {
		clock.Add(time.Second)
		s.record(errors.New("skipped"))
	}
	clock.Add(storeErrorLogEvery)
	s.record(errors.New("second"))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("logged %d lines, want 2:\n%s", len(lines), buf.String())
	}
	for i, want := range []string{"err=first errors_not_logged=0", "err=second errors_not_logged=5"} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d = %q, want it to hold %q", i, lines[i], want)
		}
	}
}
