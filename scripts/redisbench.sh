#!/usr/bin/env bash
# Sluice on Redis against this machine's RLS ceiling, in one run (issue 17). For 1 and 4
# descriptors (c=50, one connection, 100K users) it measures, each right after a ceiling row of the
# same shape: the no-op RLS server, Sluice on its memory store, Sluice on Redis, and, when BIN_PREV
# names an older sluice binary, that binary on its memory store and on the same Redis. The machine is shared and its speed
# drifts by tens of percent over minutes, so compare ratios to the ceiling, not rates across runs.
# Per row it records checks/s, p99, the ratio, the server's CPU per check (/proc/PID/stat
# utime+stime), Redis's CPU per check (INFO cpu used_cpu_sys+used_cpu_user; network work counts),
# script calls per check (INFO commandstats; below 1 when coalesced), fail-open decisions
# (sluice_checks_total{mode="fallback"}, one per limit) and breaker
# transitions (the "store circuit breaker" warnings in the server's log).
#
#   scripts/redisbench.sh [seconds]                   # 10 s per row
#   BIN_PREV=/tmp/sluice-prev scripts/redisbench.sh   # add the previous binary's rows
#   PROFILE=/tmp/redis4.pprof scripts/redisbench.sh   # then a CPU profile of Sluice on Redis, 4 descriptors
#
# SLUICE_FLAGS adds serve flags to every Sluice; the store deadline is left at its default so that
# a loaded Redis tripping the breaker shows in the table. Needs ../shared/bench and redis-server.
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
command -v redis-server >/dev/null || { echo "redisbench: needs redis-server" >&2; exit 1; }
go build -o "$BIN/sluice" ./cmd/sluice

# shellcheck source=scripts/benchlib.sh
. scripts/benchlib.sh
TICK=$(getconf CLK_TCK)
build_load

# fallback HTTPPORT prints the sum of the server's fail-open decisions.
fallback() { curl -s "http://127.0.0.1:$1/metrics" | awk '/^sluice_checks_total\{/ && /mode="fallback"/ {s+=$NF} END{printf "%d", s}'; }
# script_calls prints how many script calls (FCALL, EVALSHA, EVAL) Redis ran since the last resetstat.
script_calls() { redis-cli -p "$RPORT" info commandstats | tr -d '\r' | awk -F'[=,:]' '/^cmdstat_(fcall|evalsha|eval):/{s+=$3} END{printf "%d", s}'; }
# transitions LOG prints how many breaker state changes the server logged.
transitions() { grep -c "store circuit breaker" "$1" || true; }

start_redis
RPID=$(redis-cli -p "$RPORT" info server | tr -d '\r' | sed -n 's/^process_id://p')

NOOP=$(free_port)
"$BIN/noop-rls" -addr "127.0.0.1:$NOOP" &
PIDS+=($!)
declare -A PID GRPC HTTP LOG
PID[ceiling]=$!
GRPC[ceiling]=$NOOP

# start NAME BIN [serve flags...] starts a Sluice and records its pid, ports and log.
start() {
  local name=$1 bin=$2
  shift 2
  HTTP[$name]=$(free_port)
  GRPC[$name]=$(free_port)
  LOG[$name]=$BIN/$name.log
  "$bin" serve --config examples/bench --http "127.0.0.1:${HTTP[$name]}" --grpc "127.0.0.1:${GRPC[$name]}" \
    --data-dir "$BIN/data-$name" --log-level warn "$@" ${SLUICE_FLAGS:-} >"${LOG[$name]}" 2>&1 &
  PID[$name]=$!
  PIDS+=($!)
  wait_port "${HTTP[$name]}"
  wait_port "${GRPC[$name]}"
}
start memory "$BIN/sluice"
start redis "$BIN/sluice" --store "redis://127.0.0.1:$RPORT" --pprof
rows="memory redis"
if [ -n "${BIN_PREV:-}" ]; then
  start memory-prev "$BIN_PREV"
  start redis-prev "$BIN_PREV" --store "redis://127.0.0.1:$RPORT"
  rows="memory memory-prev redis redis-prev"
fi

TABLE=$BIN/table
printf '%-12s %2s %9s %9s %6s %12s %11s %10s %9s %8s\n' server desc checks/s p99 ratio "server µs/ck" "redis µs/ck" "calls/ck" degraded breaker >"$TABLE"

# run NAME DESCRIPTORS runs the load against NAME and appends its row to the table.
run() {
  local name=$1 n=$2 out calls rate p99 t0 t1 r0 r1 f0=0 f1=0 b0=0 b1=0 isredis=0 sc=0
  case $name in redis*) isredis=1 ;; esac
  if [ $isredis = 1 ]; then redis-cli -p "$RPORT" flushall >/dev/null; redis-cli -p "$RPORT" config resetstat >/dev/null; fi
  if [ "$name" != ceiling ]; then f0=$(fallback "${HTTP[$name]}"); b0=$(transitions "${LOG[$name]}"); fi
  t0=$(cpu_ticks "${PID[$name]}")
  r0=$(redis_cpu)
  out=$("$BIN/rlsload" -addr "127.0.0.1:${GRPC[$name]}" -c 50 -conns 1 -d "${D}s" -keys 100000 -descriptors "$n" | tail -n 1)
  r1=$(redis_cpu)
  if [ $isredis = 1 ]; then sc=$(script_calls); fi
  t1=$(cpu_ticks "${PID[$name]}")
  if [ "$name" != ceiling ]; then f1=$(fallback "${HTTP[$name]}"); b1=$(transitions "${LOG[$name]}"); fi
  echo "== $name, $n descriptor(s): $out"
  calls=$(echo "$out" | sed -n 's/^calls \([0-9]*\).*/\1/p')
  rate=$(echo "$out" | sed -n 's/.*: \([0-9.]*\)\/s.*/\1/p')
  p99=$(echo "$out" | sed -n 's/.*p99 \([^ ]*\) .*/\1/p')
  [ "$name" = ceiling ] && CEIL=$rate
  awk -v name="$name" -v n="$n" -v rate="$rate" -v p99="$p99" -v ceil="$CEIL" -v calls="$calls" \
    -v t="$((t1 - t0))" -v tick="$TICK" -v r0="$r0" -v r1="$r1" -v isredis="$isredis" \
    -v sc="$sc" -v deg="$((f1 - f0))" -v br="$((b1 - b0))" -v sl="$([ "$name" = ceiling ] && echo - || echo x)" 'BEGIN{
      rcpu = isredis ? sprintf("%.1f", (r1 - r0) * 1e6 / calls) : "-"
      cpc = isredis ? sprintf("%.3f", sc / calls) : "-"
      printf "%-12s %2d %9.0f %9s %6.2f %12.1f %11s %10s %9s %8s\n", name, n, rate, p99, rate / ceil,
        t / tick * 1e6 / calls, rcpu, cpc, sl == "-" ? "-" : deg, sl == "-" ? "-" : br
    }' >>"$TABLE"
}

for n in 1 4; do
  for name in $rows; do
    run ceiling "$n"
    run "$name" "$n"
  done
done
echo
echo "One run, ${D}s per row, c=50, 1 connection, 100K users; ratio = checks/s over the ceiling row just before."
echo "server µs/ck: CPU of the server process per check (the ceiling row: noop-rls); redis µs/ck: Redis's CPU per check."
echo "calls/ck: Redis script calls per check (below 1: coalesced); degraded: fail-open decisions (one per limit); breaker: circuit breaker transitions."
cat "$TABLE"

if [ -n "${PROFILE:-}" ]; then
  redis-cli -p "$RPORT" flushall >/dev/null
  "$BIN/rlsload" -addr "127.0.0.1:${GRPC[redis]}" -c 50 -conns 1 -d "$((D + 4))s" -keys 100000 -descriptors 4 >/dev/null &
  load=$!
  sleep 2
  curl -s -o "$PROFILE" "http://127.0.0.1:${HTTP[redis]}/debug/pprof/profile?seconds=$D"
  wait "$load"
  echo
  echo "CPU profile of Sluice on Redis, 4 descriptors: $PROFILE (go tool pprof -top $PROFILE)"
fi
