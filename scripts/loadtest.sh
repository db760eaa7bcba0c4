#!/usr/bin/env bash
# Throughput of Sluice against this machine's ceiling. The machine is shared and its speed drifts
# by tens of percent over minutes, so every Sluice row is measured right after a ceiling row of
# the same shape, and the ratio printed is to that ceiling. Needs ../shared/bench (the load
# tools) and wrk (apt); the Redis rows need redis-server.
#   scripts/loadtest.sh [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
D=${1:-20}
BENCH=${BENCH:-../shared/bench}
BIN=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$BIN"' EXIT
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
(cd "$BENCH/noop-rls" && go build -o "$BIN/noop-rls" .)
(cd "$BENCH/noop-http" && go build -o "$BIN/noop-http" .)
(cd "$BENCH/rlsload" && go build -o "$BIN/rlsload" .)
go build -o "$BIN/sluice" ./cmd/sluice

wait_port() { for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

# rls PORT DESCRIPTORS prints the load generator's summary and sets RATE (calls/s).
rls() {
  local out
  out=$("$BIN/rlsload" -addr "127.0.0.1:$1" -c 50 -conns 1 -d "${D}s" -keys 100000 -descriptors "$2" | tail -n 1)
  echo "$out"
  RATE=$(echo "$out" | sed -n 's/.*: \([0-9.]*\)\/s.*/\1/p')
  CALLS=$(echo "$out" | sed -n 's/^calls \([0-9]*\).*/\1/p')
}
# http PORT prints wrk's summary and sets RATE.
http() {
  local out
  out=$(wrk -t2 -c50 -d"${D}s" --latency -s "$BENCH/check.lua" "http://127.0.0.1:$1" | grep -E "Requests/sec|50%|99%|Non-2xx")
  echo "$out"
  RATE=$(echo "$out" | sed -n 's/Requests\/sec: *\([0-9.]*\).*/\1/p')
}
ratio() { awk "BEGIN{printf \"   ratio to the ceiling just before: %.2f\n\", $1/$2}"; }

"$BIN/noop-rls" -addr 127.0.0.1:18599 &
"$BIN/noop-http" -addr 127.0.0.1:18598 &
"$BIN/sluice" serve --config examples/bench --http 127.0.0.1:18080 --grpc 127.0.0.1:18081 --data-dir "$BIN/data" --log-level warn ${SLUICE_FLAGS:-} &
wait_port 18599; wait_port 18598; wait_port 18080; wait_port 18081
redis=0
if [ "${REDIS:-1}" = 1 ] && command -v redis-server >/dev/null; then
  redis=1
  redis-server --port 18379 --bind 127.0.0.1 --save "" --appendonly no --dir "$BIN" --logfile "$BIN/redis.log" &
  wait_port 18379
  # --store-timeout 250ms: with the 10 ms default, a Redis on the same two cores as the load
  # sometimes misses the deadline, the breaker opens and fail-open answers flatter the row.
  "$BIN/sluice" serve --config examples/bench --http 127.0.0.1:18090 --grpc 127.0.0.1:18091 --store redis://127.0.0.1:18379 --store-timeout 250ms --log-level warn ${SLUICE_FLAGS:-} &
  wait_port 18090; wait_port 18091
fi

for n in 1 4; do
  echo "== RLS ceiling (noop-rls), $n descriptor(s)"; rls 18599 "$n"; ceiling=$RATE
  echo "== RLS sluice (memory store), $n descriptor(s)"; rls 18081 "$n"; ratio "$RATE" "$ceiling"
  if [ $redis = 1 ]; then
    echo "== RLS ceiling (noop-rls), $n descriptor(s)"; rls 18599 "$n"; ceiling=$RATE
    redis-cli -p 18379 config resetstat >/dev/null
    echo "== RLS sluice (redis store), $n descriptor(s)"; rls 18091 "$n"; ratio "$RATE" "$ceiling"
    { redis-cli -p 18379 info commandstats | grep -E "cmdstat_(evalsha|eval|fcall):" || true; } | tr -d '\r' | while IFS=: read -r name stats; do
      n_calls=$(echo "$stats" | sed 's/calls=\([0-9]*\).*/\1/'); per=$(echo "$stats" | sed 's/.*usec_per_call=\([0-9.]*\).*/\1/')
      echo "   ${name#cmdstat_}: $(awk "BEGIN{printf \"%.3f\", $n_calls/$CALLS}") per request, ${per} µs each inside Redis"
    done
  fi
done
echo "== HTTP ceiling (noop-http)"; http 18598; ceiling=$RATE
echo "== HTTP sluice /v1/check (memory store)"; http 18080; ratio "$RATE" "$ceiling"
