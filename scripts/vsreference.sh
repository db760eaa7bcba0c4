#!/usr/bin/env bash
# Sluice against Envoy's reference rate limit service (E) on the same Redis, in one run
# (issue 31). For 1 and 4 descriptors it alternates E and Sluice three times (E, S, E, S, E, S),
# each run on an emptied Redis with its statistics reset, and prints per run the checks per
# second and Redis's CPU per check (INFO cpu, network work included), then per alternation the
# ratios Sluice/E and their median and spread. Each round also runs the shared bench's no-op
# RLS server (N), which answers at once: N/E is the most any server could reach against E on
# this machine in that round (the load generator and gRPC alone), and Sluice/no-op how near
# Sluice came to it. Both serve the shared bench's domain (user
# 1000/minute, tenant 100000/minute, endpoint 100000/second, global 1000000/second). Each row
# also reports the CPU per check of the server, of the load generator and of Redis, and the
# host's idle cores: on a machine they share, a server's throughput follows what all three
# spend per check. The machine is shared: compare the ratios of one run, not rates across runs.
#
#   scripts/vsreference.sh [seconds]        # 10 s per run
#   CLUSTER=3 scripts/vsreference.sh        # on a 3-primary Redis Cluster instead (Redis CPU summed)
#   E_BIN=/path/service_cmd scripts/vsreference.sh
#
# E is built with `go install github.com/envoyproxy/ratelimit/src/service_cmd@latest` into
# ~/.cache/sluice-bench unless E_BIN names it. SLUICE_FLAGS adds serve flags to Sluice
# (SLUICE_FLAGS=--allowances measures node allowances, and prints their counts last). Needs
# ../shared/bench and redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
D=${1:-10}
BENCH=${BENCH:-../shared/bench}
BIN=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$BIN"
}
trap cleanup EXIT
# shellcheck source=scripts/benchlib.sh
. scripts/benchlib.sh
command -v redis-server >/dev/null || { echo "vsreference: needs redis-server" >&2; exit 1; }
E_BIN=${E_BIN:-$HOME/.cache/sluice-bench/service_cmd}
if [ ! -x "$E_BIN" ]; then
  mkdir -p "$(dirname "$E_BIN")"
  echo "vsreference: building Envoy's reference service into $E_BIN" >&2
  (cd "$BIN" && GOBIN=$(dirname "$E_BIN") go install github.com/envoyproxy/ratelimit/src/service_cmd@latest)
fi
build_load
go build -o "$BIN/sluice" ./cmd/sluice

mkdir -p "$BIN/runtime/ratelimit/config" "$BIN/sluice-config"
cat >"$BIN/runtime/ratelimit/config/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100000}
  - key: endpoint
    rate_limit: {unit: second, requests_per_unit: 100000}
  - key: global
    rate_limit: {unit: second, requests_per_unit: 1000000}
YAML
cp "$BIN/runtime/ratelimit/config/bench.yaml" "$BIN/sluice-config/"
if [ -n "${CLUSTER:-}" ]; then
  start_cluster "$CLUSTER"
  E_REDIS=(REDIS_TYPE=cluster REDIS_URL="$RADDRS")
  S_STORE="redis-cluster://$RADDRS"
else
  start_redis
  E_REDIS=(REDIS_URL="127.0.0.1:$RPORT")
  S_STORE="redis://127.0.0.1:$RPORT"
fi

EGRPC=$(free_port)
env USE_STATSD=false REDIS_SOCKET_TYPE=tcp "${E_REDIS[@]}" RUNTIME_ROOT="$BIN/runtime" \
  RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false GRPC_PORT="$EGRPC" PORT="$(free_port)" \
  DEBUG_PORT="$(free_port)" LOG_LEVEL=warn "$E_BIN" >"$BIN/e.log" 2>&1 &
EPID=$!
PIDS+=($!)
NGRPC=$(free_port)
"$BIN/noop-rls" -addr "127.0.0.1:$NGRPC" >"$BIN/noop.log" 2>&1 &
NPID=$!
PIDS+=($!)
SGRPC=$(free_port)
SHTTP=$(free_port)
"$BIN/sluice" serve --config "$BIN/sluice-config" --store "$S_STORE" --http "127.0.0.1:$SHTTP" \
  --grpc "127.0.0.1:$SGRPC" --data-dir "$BIN/data" --log-level warn ${SLUICE_FLAGS:-} >"$BIN/sluice.log" 2>&1 &
SPID=$!
PIDS+=($!)
wait_port "$EGRPC"
wait_port "$SGRPC"
wait_port "$NGRPC"

ROWS=$BIN/rows
# run NAME PORT PID DESCRIPTORS ROUND appends "NAME n round rate redis load server idle" to
# ROWS: checks/s, then the CPU each part spent per check (µs: Redis, the load generator, the
# server under test) and the host's idle cores during the row.
run() {
  local name=$1 port=$2 pid=$3 n=$4 round=$5 out r0 r1 l0 l1 s0 s1 i0 i1 t0 t1 calls rate
  redis_each flushall
  redis_each config resetstat
  r0=$(redis_cpu) s0=$(cpu_ticks "$pid") i0=$(host_idle) t0=$(date +%s.%N)
  children_cpu l0
  out=$(rlsload "127.0.0.1:$port" "$n" "$D")
  children_cpu l1
  r1=$(redis_cpu) s1=$(cpu_ticks "$pid") i1=$(host_idle) t1=$(date +%s.%N)
  calls=$(load_calls "$out")
  rate=$(load_rate "$out")
  echo "== $name, $n descriptor(s), round $round: $out"
  awk -v name="$name" -v n="$n" -v round="$round" -v rate="$rate" -v calls="$calls" -v r0="$r0" -v r1="$r1" \
    -v l0="$l0" -v l1="$l1" -v s0="$s0" -v s1="$s1" -v i0="$i0" -v i1="$i1" -v t0="$t0" -v t1="$t1" -v hz="$(getconf CLK_TCK)" \
    'BEGIN{printf "%s %d %d %.0f %.2f %.1f %.1f %.2f\n", name, n, round, rate, (r1 - r0) * 1e6 / calls,
      (l1 - l0) * 1e6 / calls, (s1 - s0) / hz * 1e6 / calls, (i1 - i0) / hz / (t1 - t0)}' >>"$ROWS"
}

for n in 1 4; do
  for round in 1 2 3; do
    run E "$EGRPC" "$EPID" "$n" "$round"
    run S "$SGRPC" "$SPID" "$n" "$round"
    run N "$NGRPC" "$NPID" "$n" "$round"
  done
done

echo
echo "One run, ${D}s per row, c=50, 1 connection, 100K users, the same Redis emptied before each row."
echo "CPU per check in µs: Redis's, the load generator's and the server's; idle: the host's idle cores."
printf '%-7s %2s %5s %9s %12s %8s %8s %6s\n' server desc round checks/s "redis µs/ck" load server idle
awk '{printf "%-7s %2d %5d %9d %12.2f %8.1f %8.1f %6.2f\n", ($1 == "E" ? "E" : ($1 == "S" ? "Sluice" : "no-op")), $2, $3, $4, $5, $6, $7, $8}' "$ROWS"
echo
echo "Sluice/E per alternation (Sluice's run against the E run just before it): median [min-max]"
awk '
  $1 == "E" { rate[$2, $3] = $4; cpu[$2, $3] = $5 }
  $1 == "S" { tr[$2] = tr[$2] " " $4 / rate[$2, $3]; cr[$2] = cr[$2] " " $5 / cpu[$2, $3]; srate[$2, $3] = $4 }
  $1 == "N" { nr[$2] = nr[$2] " " $4 / rate[$2, $3]; sn[$2] = sn[$2] " " srate[$2, $3] / $4 }
  { k = $1 SUBSEP $2; srv[k] = srv[k] " " $7; load[k] = load[k] " " $6; red[k] = red[k] " " $5; all[k] = all[k] " " ($5 + $6 + $7); idle[k] = idle[k] " " $8 }
  # sorted splits list into a, sorted, and returns its length.
  function sorted(list, a,   k, i, j, t) {
    k = split(list, a, " ")
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return k
  }
  function summary(list,   a, k) {
    k = sorted(list, a)
    return sprintf("%.2f [%.2f-%.2f]", a[int((k + 1) / 2)], a[1], a[k])
  }
  function median(list,   a, k) {
    k = sorted(list, a)
    return a[int((k + 1) / 2)]
  }
  END {
    for (n = 1; n <= 4; n += 3) {
      printf "  %d descriptor(s): throughput %s; Redis CPU per check %s; no-op/E %s; Sluice/no-op %s\n", n, summary(tr[n]), summary(cr[n]), summary(nr[n]), summary(sn[n])
    }
    print ""
    print "Where the host'"'"'s CPU went, per check (median of the three rounds, µs): the server'"'"'s, the load generator'"'"'s, Redis'"'"'s, and all three"
    split("E S N", names, " ")
    for (n = 1; n <= 4; n += 3) {
      for (i = 1; i <= 3; i++) {
        k = names[i] SUBSEP n
        printf "  %d descriptor(s), %-6s server %5.1f  load %5.1f  Redis %5.1f  all %5.1f  (idle cores %.2f)\n", n, (names[i] == "E" ? "E" : (names[i] == "S" ? "Sluice" : "no-op")), median(srv[k]), median(load[k]), median(red[k]), median(all[k]), median(idle[k])
      }
    }
  }' "$ROWS"

# With SLUICE_FLAGS=--allowances: how many of Sluice's checks, over the whole run, its node
# decided from the units it held, and how many went to Redis.
if command -v curl >/dev/null; then
  curl -s "http://127.0.0.1:$SHTTP/metrics" | awk '/^sluice_allowance_(decisions|grants)_total/ {
    printf "%s%s %s", (n++ ? ", " : "\nSluice node allowances over the run: "), $1, $2 } END { if (n) print "" }' || true
fi
