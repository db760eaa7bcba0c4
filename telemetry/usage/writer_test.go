package usage

import (
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// TestRowsDoNotKeepTheRequest: the rows of a decision whose strings are substrings of one large
// buffer (as the RLS decoder makes them) hold copies, so that a row does not keep the request
// alive until the hand-over.
func TestRowsDoNotKeepTheRequest(t *testing.T) {
	t.Parallel()
	request := strings.Repeat("x", 4096) + "tenant-a|user-b|10.0.0.1|/api/items|user-c"
	at := strings.Index(request, "tenant-a")
	part := func(s string) string {
		i := strings.Index(request[at:], s) + at
		return request[i : i+len(s)]
	}
	r := &Recorder{o: Options{MaxRows: 10, Now: func() time.Time { return time.Unix(600, 0) }}}
	c := newCounts()
	e := event{tenant: part("tenant-a"), user: part("user-b"), ip: part("10.0.0.1"), endpoint: part("/api/items"), n: 1}
	e.results[0] = result{rule: "per-user", limit: 10, outcome: denied}
	r.add(c, &e)
	r.add(c, &e) // rows that exist: updated, their keys not replaced by the request's strings
	e.user = part("user-c")
	r.add(c, &e) // a new violation row beside a usage row that exists
	start := uintptr(unsafe.Pointer(unsafe.StringData(request)))
	inRequest := func(s string) bool {
		p := uintptr(unsafe.Pointer(unsafe.StringData(s)))
		return s != "" && p >= start && p < start+uintptr(len(request))
	}
	if len(c.usage) != 1 || len(c.violations) != 2 {
		t.Fatalf("%d usage and %d violation rows, want 1 and 2", len(c.usage), len(c.violations))
	}
	for k, v := range c.usage {
		if inRequest(k.tenant) || k.tenant != "tenant-a" || v.denied != 3 {
			t.Errorf("usage row %+v %+v: want a copy of tenant-a, denied 3", k, v)
		}
	}
	for k, v := range c.violations {
		for _, s := range []string{k.tenant, k.user, k.ip, k.endpoint} {
			if inRequest(s) {
				t.Errorf("violation row keeps %q from the request", s)
			}
		}
		if want := map[string]int64{"user-b": 2, "user-c": 1}[k.user]; k.tenant != "tenant-a" || k.ip != "10.0.0.1" || k.endpoint != "/api/items" || v.denied != want {
			t.Errorf("violation row %+v %+v", k, *v)
		}
	}
}

// BenchmarkGatherAdd is the gatherer's cost per event of one limit: "allowed" updates one of
// 1,000 tenants' usage rows, "denied" one of 10,000 users' violation rows too; the rows exist
// after the first pass, as they do over a flush.
func BenchmarkGatherAdd(b *testing.B) {
	for _, tc := range []struct {
		name string
		o    outcome
	}{{"allowed", allowed}, {"denied", denied}} {
		b.Run(tc.name, func(b *testing.B) {
			r := &Recorder{o: Options{MaxRows: 1 << 20, Now: func() time.Time { return time.Unix(600, 0) }}}
			c := newCounts()
			events := make([]event, 10_000)
			for i := range events {
				events[i] = event{tenant: "t" + strconv.Itoa(i%1000), user: "u" + strconv.Itoa(i), ip: "192.0.2.1", endpoint: "/api/items", n: 1}
				events[i].results[0] = result{rule: "per-user", limit: 100, outcome: tc.o}
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				r.add(c, &events[i%len(events)])
			}
		})
	}
}
