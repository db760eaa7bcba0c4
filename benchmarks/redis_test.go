package benchmarks

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/key"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/store"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// naiveTokenBucket is the hand-rolled script many services run: one EVAL per limit, float
// tokens, the caller's clock. Four limits are four round trips, and a denial by the fourth has
// already consumed from the first three.
const naiveTokenBucket = `
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens') or ARGV[2])
local last = tonumber(redis.call('HGET', KEYS[1], 'last') or ARGV[3])
local rate, burst, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
tokens = math.min(burst, tokens + (now - last) * rate)
local allowed = 0
if tokens >= 1 then tokens = tokens - 1; allowed = 1 end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'last', now)
redis.call('PEXPIRE', KEYS[1], 60000)
return allowed`

func opsFor(n int, user int) []store.Op {
	p, _ := algorithm.NewParams(algorithm.TokenBucket, 1_000_000_000, 0, time.Second)
	ops := make([]store.Op, n)
	for i := range ops {
		k := key.AppendTag(key.AppendHead(nil, fmt.Sprint("rule", i), "1"), 'u', strconv.Itoa(user))
		ops[i] = store.Op{Key: k, Params: &p, Cost: 1}
	}
	return ops
}

// BenchmarkRedis compares, in one run against one redis-server: Sluice's store (one script
// call for all the limits of a request) with the naive one-EVAL-per-limit sequence, for 1 and 4
// limits; and the two Redis clients on the same EVALSHA.
func BenchmarkRedis(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	st, err := redisstore.New(ctx, "redis://"+srv.Addr)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("sluice-store/%dlimits", n), func(b *testing.B) {
			var next atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				user := int(next.Add(1))
				batch := &store.Batch{Ops: opsFor(n, user)}
				res := make([]algorithm.Result, n)
				for pb.Next() {
					if _, err := st.Apply(ctx, batch, res); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		b.Run(fmt.Sprintf("naive-eval-per-limit/%dlimits", n), func(b *testing.B) {
			client := st.Client()
			var next atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				user := next.Add(1)
				for pb.Next() {
					now := strconv.FormatFloat(float64(time.Now().UnixMicro())/1e6, 'f', 6, 64)
					for i := range n {
						cmd := client.B().Eval().Script(naiveTokenBucket).Numkeys(1).
							Key(fmt.Sprintf("naive:%d:%d", i, user)).Arg("1000000000", "1000000000", now).Build()
						if err := client.Do(ctx, cmd).Error(); err != nil {
							b.Error(err)
							return
						}
					}
				}
			})
		})
	}

	script := "return redis.call('INCR', KEYS[1])"
	b.Run("client/rueidis-evalsha", func(b *testing.B) {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		lua := rueidis.NewLuaScript(script)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := lua.Exec(ctx, c, []string{"k"}, nil).Error(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("client/go-redis-evalsha", func(b *testing.B) {
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
		defer c.Close()
		lua := goredis.NewScript(script)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := lua.Run(ctx, c, []string{"k"}).Err(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
