#!/usr/bin/env bash
# Reservations and concurrency slots against plain checks through the binary, in one run
# (issue 28): on the memory store and on Redis, alternating rows (check, reserve+commit,
# acquire+release, twice) so the
# shared machine's drift shows; per Redis row, Redis CPU per round trip (INFO cpu); then
# memory per live lease: RSS of sluice (memory store) and Redis used_memory before and after
# holding N unsettled leases.
#   scripts/leasebench.sh [seconds] [leases]
set -euo pipefail
cd "$(dirname "$0")/.."
D=${1:-10}
N=${2:-100000}
BIN=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$BIN"
}
trap cleanup EXIT
go build -o "$BIN/sluice" ./cmd/sluice
(cd benchmarks && go build -o "$BIN/leaseload" ./leaseload)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 1 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }
cat > "$BIN/policy.yaml" <<'YAML'
rules:
  - {name: per-user, match: {endpoint: /llm}, key: [tenant, user], algorithm: token_bucket, limit: 1000000000, period: 1s}
  - {name: slots, match: {endpoint: /slots}, key: [tenant, user], algorithm: concurrency, limit: 1000000}
YAML
serve() { # serve NAME [flags...]: starts sluice, sets PORT and PID
  PORT=$(free_port)
  "$BIN/sluice" serve --config "$BIN/policy.yaml" --http "127.0.0.1:$PORT" --grpc "127.0.0.1:$(free_port)" --data-dir "$BIN/data-$1" --log-level warn 2>>"$BIN/$1.log" "${@:2}" &
  PID=$!
  PIDS+=("$PID")
  wait_port "$PORT"
}
rss_kb() { awk '/VmRSS/{print $2}' "/proc/$1/status"; }
redis_cpu() { redis-cli -p "$RPORT" info cpu | tr -d '\r' | awk -F: '/used_cpu_(sys|user):/{s+=$2} END{printf "%.3f", s}'; }
redis_mem() { redis-cli -p "$RPORT" info memory | tr -d '\r' | awk -F: '/^used_memory:/{print $2}'; }
row() { # row PORT MODE: sets OPS
  local out
  out=$("$BIN/leaseload" -addr "127.0.0.1:$1" -mode "$2" -d "${D}s")
  echo "   $out"
  OPS=$(echo "$out" | sed -n 's/.*ok, [0-9]* failed in \([0-9.]*\)s.*/\1/p')
  COUNT=$(echo "$out" | sed -n 's/^[a-z]*: \([0-9]*\) ok.*/\1/p')
}

echo "== memory store"
serve mem
MPORT=$PORT; MPID=$PID
for mode in check reserve acquire check reserve acquire; do row "$MPORT" "$mode"; done

if command -v redis-server >/dev/null; then
  RPORT=$(free_port)
  redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$BIN" --logfile "$BIN/redis.log" &
  PIDS+=("$!")
  wait_port "$RPORT"
  echo "== redis store"
  serve redis --store "redis://127.0.0.1:$RPORT" --store-timeout 250ms
  SPORT=$PORT
  for mode in check reserve acquire check reserve acquire; do
    before=$(redis_cpu)
    row "$SPORT" "$mode"
    after=$(redis_cpu)
    awk -v a="$after" -v b="$before" -v n="$COUNT" -v m="$mode" 'BEGIN{printf "   redis CPU per %s round trip: %.1f µs\n", (m=="check"?"check":(m=="acquire"?"acquire+release":"reserve+commit")), (a-b)*1e6/n}'
  done
fi

echo "== memory per live lease ($N unsettled, 1h ttl)"
serve hold
HPID=$PID; HPORT=$PORT
"$BIN/leaseload" -addr "127.0.0.1:$HPORT" -mode hold -n 2000 -users 100 >/dev/null # warm: buckets, buffers
r0=$(rss_kb "$HPID")
"$BIN/leaseload" -addr "127.0.0.1:$HPORT" -mode hold -n "$N" -users 100
r1=$(rss_kb "$HPID")
awk -v a="$r1" -v b="$r0" -v n="$N" 'BEGIN{printf "   sluice (memory store) RSS %+.1f MiB: %.0f bytes per lease\n", (a-b)/1024, (a-b)*1024/n}'
"$BIN/leaseload" -addr "127.0.0.1:$HPORT" -mode hold-slots -n "$N" -users 100
r2=$(rss_kb "$HPID")
awk -v a="$r2" -v b="$r1" -v n="$N" 'BEGIN{printf "   sluice (memory store) RSS %+.1f MiB: %.0f bytes per lease holding a slot\n", (a-b)/1024, (a-b)*1024/n}'
if command -v redis-server >/dev/null; then
  m0=$(redis_mem)
  "$BIN/leaseload" -addr "127.0.0.1:$SPORT" -mode hold -n "$N" -users 100
  m1=$(redis_mem)
  awk -v a="$m1" -v b="$m0" -v n="$N" 'BEGIN{printf "   redis used_memory %+.1f MiB: %.0f bytes per lease\n", (a-b)/1048576, (a-b)/n}'
  "$BIN/leaseload" -addr "127.0.0.1:$SPORT" -mode hold-slots -n "$N" -users 100
  m2=$(redis_mem)
  awk -v a="$m2" -v b="$m1" -v n="$N" 'BEGIN{printf "   redis used_memory %+.1f MiB: %.0f bytes per lease holding a slot\n", (a-b)/1048576, (a-b)/n}'
fi
