package redis

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/breaker"
)

// BenchmarkApply measures one request of 1 and 4 limits through the store against a local
// redis-server, with 50 callers at once (b.SetParallelism over GOMAXPROCS), with and without
// coalescing: allocations per request, and the mean number of requests a script call decided.
//
//	go test -run '^$' -bench BenchmarkApply -benchtime 2s ./store/redis/
func BenchmarkApply(b *testing.B) {
	srv := redistest.Start(b)
	p, _ := algorithm.NewParams(algorithm.TokenBucket, 1_000_000_000, 0, time.Second)
	for _, coalesce := range []bool{true, false} {
		st, err := New(ctx, "redis://"+srv.Addr, WithCoalescing(coalesce))
		if err != nil {
			b.Fatal(err)
		}
		// guarded is the store as serve uses it: behind the breaker and its deadline.
		guarded := breaker.New(st, breaker.Options{Timeout: 100 * time.Millisecond})
		for _, c := range []struct {
			name string
			n    int
			st   store.Store
		}{{"1limits", 1, st}, {"4limits", 4, st}, {"4limits-guarded", 4, guarded}} {
			n := c.n
			b.Run(fmt.Sprintf("coalesce=%v/%s", coalesce, c.name), func(b *testing.B) {
				var next atomic.Int64
				calls0, batches0 := st.CoalesceStats()
				cpu0 := processCPU(b)
				b.ReportAllocs()
				b.SetParallelism(max(1, 50/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					user := strconv.FormatInt(next.Add(1), 10)
					ops := make([]store.Op, n)
					for i := range ops {
						// The first limit is the caller's, the others global, as a request
						// under per-user, per-tenant, per-endpoint and global rules.
						k := key.AppendHead(nil, "rule"+strconv.Itoa(i), "1")
						if i == 0 {
							k = key.AppendTag(k, 'u', user)
						}
						ops[i] = store.Op{Key: k, Params: &p, Cost: 1}
					}
					batch := &store.Batch{Ops: ops}
					res := make([]algorithm.Result, n)
					for pb.Next() {
						if _, err := c.st.Apply(ctx, batch, res); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric((processCPU(b)-cpu0)*1e6/float64(b.N), "sluice-µs/req")
				if calls, batches := st.CoalesceStats(); calls > calls0 {
					b.ReportMetric(float64(batches-batches0)/float64(calls-calls0), "reqs/call")
				}
			})
		}
		st.Close()
	}
}

// BenchmarkRedisCPU measures Redis's own CPU per request (INFO cpu, used_cpu_user and
// used_cpu_sys: script execution and network work alike) for the load shape of
// scripts/redisbench.sh: fixed windows of 1 s, one limit per descriptor (100K users, 1,000
// tenants, 100 endpoints, one global), 50 callers, coalescing on. Redis's CPU is counted by
// Redis itself, so the figure holds up on a busy machine better than a rate does.
//
// Plain windows on (the default) and off, on one server and on a 3-primary Cluster (its nodes'
// CPU summed), in one run.
//
//	go test -run '^$' -bench BenchmarkRedisCPU -benchtime 100000x ./store/redis/
func BenchmarkRedisCPU(b *testing.B) {
	for _, cluster := range []bool{false, true} {
		for _, plain := range []bool{true, false} {
			name := "server/plain"
			if cluster {
				name = "cluster/plain"
			}
			if !plain {
				name = strings.Replace(name, "plain", "script", 1)
			}
			b.Run(name, func(b *testing.B) { redisCPUOf(b, cluster, plain) })
		}
	}
}

// redisCPUOf is BenchmarkRedisCPU on one server or a Cluster, with plain windows (plain.go) on
// or off.
func redisCPUOf(b *testing.B, cluster, plain bool) {
	var srv []*redistest.Server
	url := ""
	if cluster {
		cl := redistest.StartCluster(b, 3, 0)
		srv, url = cl.Nodes, "redis-cluster://"+strings.Join(cl.Addrs, ",")
	} else {
		one := redistest.Start(b)
		srv, url = []*redistest.Server{one}, "redis://"+one.Addr
	}
	st, err := New(ctx, url, WithPlainWindows(plain))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	limits := []struct {
		rule   string
		tag    byte
		values int
		limit  int64
	}{{"user", 'u', 100_000, 1000}, {"tenant", 't', 1000, 100_000}, {"endpoint", 'e', 100, 1_000_000}, {"global", 0, 1, 100_000_000}}
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("%dlimits", n), func(b *testing.B) {
			params := make([]algorithm.Params, n)
			for i := range params {
				params[i], _ = algorithm.NewParams(algorithm.FixedWindow, limits[i].limit, 0, time.Second)
			}
			cpu0 := redisCPU(b, srv...)
			calls0, batches0 := st.CoalesceStats()
			plain0, _ := st.PlainStats()
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(max(1, 50/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				ops := make([]store.Op, n)
				batch := &store.Batch{Ops: ops}
				res := make([]algorithm.Result, n)
				for pb.Next() {
					x := next.Add(7919)
					for i := range ops {
						k := key.AppendHead(nil, limits[i].rule, "1")
						if limits[i].tag != 0 {
							k = key.AppendTag(k, limits[i].tag, strconv.FormatInt(x%int64(limits[i].values), 10))
						}
						ops[i] = store.Op{Key: k, Params: &params[i], Cost: 1}
					}
					if _, err := st.Apply(ctx, batch, res); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric((redisCPU(b, srv...)-cpu0)*1e6/float64(b.N), "redis-µs/req")
			if calls, batches := st.CoalesceStats(); calls > calls0 {
				b.ReportMetric(float64(batches-batches0)/float64(calls-calls0), "reqs/call")
			}
			plain1, _ := st.PlainStats()
			// Batches, not requests: on a Cluster a request is a batch per slot.
			b.ReportMetric(float64(plain1-plain0)/float64(b.N), "plain-batches/req")
		})
	}
}

// processCPU is the seconds of CPU this process has used, user and system: the store's side of
// a request (and the benchmark's own callers), with Redis, a child process, left out.
func processCPU(b *testing.B) float64 {
	b.Helper()
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		b.Fatal(err)
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano()).Seconds()
}

// redisCPU is the seconds of CPU the servers have used, user and system.
func redisCPU(b *testing.B, servers ...*redistest.Server) float64 {
	b.Helper()
	sum := 0.0
	for _, srv := range servers {
		info, err := srv.Do("INFO", "cpu")
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			name, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			if name == "used_cpu_user" || name == "used_cpu_sys" {
				f, _ := strconv.ParseFloat(v, 64)
				sum += f
			}
		}
	}
	return sum
}

// floorLibrary is the least a script can do for a request under one fixed window: read the
// key, write it back with the window's expiry, answer a number. It is what BenchmarkRedisFloor
// holds the library's cost against.
const floorLibrary = `#!lua name=sluice_floor
redis.register_function('sluice_floor_empty', function(keys, args)
  local out = {}
  for i = 1, #keys do out[i] = i end
  return out
end)
redis.register_function('sluice_floor_get_set', function(keys, args)
  local out = {}
  for i = 1, #keys do
    local v = redis.call('GET', keys[i])
    local n = 1
    if v then n = tonumber(v) + 1 end
    redis.call('SET', keys[i], n, 'PXAT', args[1])
    out[i] = n
  end
  return out
end)
`

// BenchmarkRedisFloor measures what Redis spends per request of one fixed-window limit, in
// calls of 25 requests made one after the other, as Redis's CPU per request (INFO cpu, network
// work included), on keys of two kinds:
//
//   - new: no request used the key in the window before (a user's first request of the
//     second);
//   - used: a key of 1,250 that the window's earlier requests hold. The shared bench's load
//     is mostly this: its 50 workers walk one table of requests a step apart, so each user
//     is asked ~50 times within a quarter of a second, in one window.
//
// and in four ways:
//
//   - empty: a function that takes 25 keys and answers 25 numbers: the call, its arguments
//     and its reply, nothing else;
//   - get-set: a function that reads each key and writes it back with its expiry, the least
//     a script can do;
//   - native: the same GET and SET as plain commands, 50 of them in one pipelined write;
//   - sluice: the library's multi function, 25 requests of one limit each.
//
// The gap between get-set and native is what running in a script costs; between sluice and
// get-set, what the library's bookkeeping costs (limits, replies, shared states).
//
//	go test -run '^$' -bench BenchmarkRedisFloor -benchtime 100000x ./store/redis/
func BenchmarkRedisFloor(b *testing.B) {
	srv := redistest.Start(b)
	st, err := New(ctx, "redis://"+srv.Addr)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	c := st.Client()
	if err := c.Do(ctx, c.B().FunctionLoad().Replace().FunctionCode(floorLibrary).Build()).Error(); err != nil {
		b.Fatal(err)
	}
	params, _ := algorithm.NewParams(algorithm.FixedWindow, 1000, 0, time.Second)
	op := st.opString(&store.Op{Params: &params, Cost: 1})
	user := 0
	for _, kind := range []string{"new", "used"} {
		for _, variant := range []string{"empty", "get-set", "native", "sluice"} {
			b.Run(kind+"/"+variant, func(b *testing.B) {
				floorCalls(b, srv, c, kind == "new", variant, &user, op)
			})
		}
	}
}

// floorCalls is one row of BenchmarkRedisFloor: user numbers the new keys, op is the
// library's op string.
func floorCalls(b *testing.B, srv *redistest.Server, c rueidis.Client, fresh bool, variant string, user *int, op string) {
	const perCall, used = 25, 1250 // new keys are numbered from used on
	keys := make([]string, perCall)
	args := make([]string, 0, 2*perCall)
	cpu0 := redisCPU(b, srv)
	done := 0
	for ; done < b.N; done += perCall {
		for i := range keys {
			u := (done + i) % used
			if fresh {
				*user++ // its key holds no state
				u = used + *user
			}
			keys[i] = redisKey(key.AppendTag(key.AppendHead(nil, "user", "1"), 'u', strconv.Itoa(u)))
		}
		windowEnd := time.Now().Truncate(time.Second).Add(time.Second)
		var cmds rueidis.Commands
		switch variant {
		case "empty":
			cmds = append(cmds, c.B().Fcall().Function("sluice_floor_empty").Numkeys(perCall).Key(keys...).Build())
		case "get-set":
			cmds = append(cmds, c.B().Fcall().Function("sluice_floor_get_set").Numkeys(perCall).Key(keys...).
				Arg(strconv.FormatInt(windowEnd.UnixMilli(), 10)).Build())
		case "native":
			for _, k := range keys {
				cmds = append(cmds, c.B().Get().Key(k).Build(), c.B().Set().Key(k).Value("1:1:0").Pxat(windowEnd).Build())
			}
		case "sluice":
			args = args[:0]
			for range keys {
				args = append(args, "1", op)
			}
			cmds = append(cmds, c.B().Fcall().Function(multiFunction).Numkeys(perCall).Key(keys...).Arg(args...).Build())
		}
		for _, r := range c.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric((redisCPU(b, srv)-cpu0)*1e6/float64(done), "redis-µs/req")
}

// BenchmarkOpString measures finding the wire string of an op, four limits a request, from
// parallel callers, as every request does for each of its limits.
//
//	go test -run '^$' -bench BenchmarkOpString -benchmem ./store/redis/
func BenchmarkOpString(b *testing.B) {
	st := &Store{}
	ops := make([]store.Op, 4)
	for i := range ops {
		p, _ := algorithm.NewParams(algorithm.FixedWindow, int64(1000*(i+1)), 0, time.Second)
		ops[i] = store.Op{Params: &p, Cost: 1}
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			for i := range ops {
				if st.opString(&ops[i]) == "" {
					b.Error("no op string")
				}
			}
		}
	})
}

// BenchmarkCounterRedisCPU measures Redis's CPU per request of one sliding_window_counter limit
// of 100 per 2 s, on 1,000 keys each asked at 3x its limit (the test clock moves 6.67 µs a
// request), so that each key holds its usual ~20 buckets: what the buckets cost the script
// against the two-window state (run the same benchmark on the earlier version).
//
//	go test -run '^$' -bench BenchmarkCounterRedisCPU -benchtime 100000x ./store/redis/
func BenchmarkCounterRedisCPU(b *testing.B) {
	srv := redistest.Start(b)
	c := newClock()
	st := connect(b, "redis://"+srv.Addr, c)
	p, _ := algorithm.NewParams(algorithm.SlidingWindowCounter, 100, 0, 2*time.Second)
	keys := make([][]byte, 1000)
	for i := range keys {
		keys[i] = key.AppendTag(key.AppendHead(nil, "swc", "1"), 'u', strconv.Itoa(i))
	}
	ops := []store.Op{{Params: &p, Cost: 1}}
	batch := &store.Batch{Ops: ops}
	res := make([]algorithm.Result, 1)
	cpu0 := redisCPU(b, srv)
	i := 0
	for b.Loop() {
		c.us.Add(20 / 3)
		ops[0].Key = keys[i%len(keys)]
		i++
		if _, err := st.Apply(ctx, batch, res); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric((redisCPU(b, srv)-cpu0)*1e6/float64(b.N), "redis-µs/req")
}
