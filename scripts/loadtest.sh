#!/usr/bin/env bash
# Throughput of Sluice against this machine's ceiling, back to back in one run (the ratios are
# what holds on a shared machine). Needs ../shared/bench (the load tools) and wrk (apt).
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

rls() { "$BIN/rlsload" -addr "127.0.0.1:$1" -c 50 -conns 1 -d "${D}s" -keys 100000 -descriptors "$2" | tail -n 3; }
http() { wrk -t2 -c50 -d"${D}s" --latency -s "$BENCH/check.lua" "http://127.0.0.1:$1" | grep -E "Requests/sec|50%|99%|Non-2xx"; }

stop() { kill "$1" 2>/dev/null; wait "$1" 2>/dev/null || true; }

"$BIN/noop-rls" -addr 127.0.0.1:18599 & pid=$!; wait_port 18599
echo "== RLS ceiling (noop-rls), 1 descriptor";  rls 18599 1
echo "== RLS ceiling (noop-rls), 4 descriptors"; rls 18599 4
stop $pid

"$BIN/sluice" serve --config examples/bench --http 127.0.0.1:18080 --grpc 127.0.0.1:18081 --data-dir "$BIN/data" --log-level warn ${SLUICE_FLAGS:-} & pid=$!
wait_port 18080; wait_port 18081
echo "== RLS sluice (memory store), 1 descriptor";  rls 18081 1
echo "== RLS sluice (memory store), 4 descriptors"; rls 18081 4
echo "== HTTP sluice /v1/check (memory store)"; http 18080
stop $pid

if [ "${REDIS:-1}" = 1 ] && command -v redis-server >/dev/null; then
  redis-server --port 18379 --bind 127.0.0.1 --save "" --appendonly no --dir "$BIN" --logfile "$BIN/redis.log" & rpid=$!
  wait_port 18379
  "$BIN/sluice" serve --config examples/bench --http 127.0.0.1:18080 --grpc 127.0.0.1:18081 --store redis://127.0.0.1:18379 --store-timeout 250ms --log-level warn ${SLUICE_FLAGS:-} & pid=$!
  wait_port 18080; wait_port 18081
  for n in 1 4; do
    redis-cli -p 18379 config resetstat >/dev/null
    echo "== RLS sluice (redis store), $n descriptor(s)"; out=$(rls 18081 $n); echo "$out"
    calls=$(echo "$out" | sed -n 's/^calls \([0-9]*\).*/\1/p')
    { redis-cli -p 18379 info commandstats | grep -E "cmdstat_(evalsha|eval|fcall):" || true; } | tr -d '\r' | while IFS=: read -r name stats; do
      n_calls=$(echo "$stats" | sed 's/calls=\([0-9]*\).*/\1/'); per=$(echo "$stats" | sed 's/.*usec_per_call=\([0-9.]*\).*/\1/')
      echo "   ${name#cmdstat_}: $(awk "BEGIN{printf \"%.3f\", $n_calls/$calls}") per request, ${per} µs each inside Redis"
    done
  done
  stop $pid; stop $rpid
fi

"$BIN/noop-http" -addr 127.0.0.1:18598 & pid=$!; wait_port 18598
echo "== HTTP ceiling (noop-http)"; http 18598
stop $pid
