#!/usr/bin/env bash
# What the control plane costs the Envoy path (issue 27), in one run: RLS on the memory store
# with no control state (A) and with 10,000 overrides and 1,000 exemptions in force (B), each
# right after the no-op RLS server (the machine's ceiling), alternated three times. B's
# overrides name the tenants of ../shared/bench's load (t0..t999, a multiplier of 2 on every
# limit) and 9,000 tenants it never sends; its exemptions name users it never sends. So every
# request of B reads its caller, looks up its overrides and finds one. Prints calls/s per row
# and the same-run ratios A/ceiling, B/ceiling and B/A.
#
#   scripts/envoycontrolbench.sh [seconds] [descriptors]   # 10 s per row, 4 descriptors
#
# Needs ../shared/bench.
set -euo pipefail
cd "$(dirname "$0")/.."
D=${1:-10}
N=${2:-4}
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
build_load
go build -o "$BIN/sluice" ./cmd/sluice

mkdir -p "$BIN/policy"
cat > "$BIN/policy/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - {key: user, rate_limit: {unit: minute, requests_per_unit: 1000}}
  - {key: tenant, rate_limit: {unit: minute, requests_per_unit: 100000}}
  - {key: endpoint, rate_limit: {unit: second, requests_per_unit: 100000}}
  - {key: global, rate_limit: {unit: second, requests_per_unit: 1000000}}
YAML

NOOP=$(free_port)
"$BIN/noop-rls" -addr "127.0.0.1:$NOOP" & PIDS+=($!)
# serve NAME DIR: starts a Sluice on the memory store with the policy folder DIR; sets
# NAME_GRPC and NAME_HTTP.
serve() {
  local g h
  g=$(free_port); h=$(free_port)
  "$BIN/sluice" serve --config "$2" --data-dir "$BIN/data-$1" \
    --grpc "127.0.0.1:$g" --http "127.0.0.1:$h" --log-level warn > "$BIN/$1.log" 2>&1 & PIDS+=($!)
  eval "${1}_GRPC=$g ${1}_HTTP=$h"
  wait_port "$g"; wait_port "$h"
}

# B's control state, in a policy file beside the domain (the admin API's path takes ~20
# changes a second here, each compiling the whole state again: issue 29).
mkdir -p "$BIN/policy-B"
cp "$BIN/policy/bench.yaml" "$BIN/policy-B/"
until=$(date -u -d '+1 day' +%Y-%m-%dT%H:%M:%SZ)
{
  echo "overrides:"
  for i in $(seq 0 9999); do
    tenant="x$i"; [ "$i" -lt 1000 ] && tenant="t$i"
    echo "  - {tenant: $tenant, type: multiplier, value: 2, expires_at: \"$until\", reason: bench}"
  done
  echo "exemptions:"
  for i in $(seq 0 999); do echo "  - {user: nobody-$i}"; done
} > "$BIN/policy-B/control.yaml"
serve A "$BIN/policy"
serve B "$BIN/policy-B"
# B enforces its overrides: tenant t1's limit is doubled.
curl -s "http://127.0.0.1:$B_HTTP/json" -d '{"domain":"bench","descriptors":[{"entries":[{"key":"tenant","value":"t1"}]}]}' |
  grep -q '"requestsPerUnit":200000' || { echo "envoycontrolbench: B does not apply its overrides" >&2; exit 1; }

rate() { "$BIN/rlsload" -addr "127.0.0.1:$1" -c 50 -conns 1 -d "${D}s" -keys 100000 -descriptors "$N" 2>&1 | awk '/^calls/ {for (i=1;i<=NF;i++) if ($i ~ /\/s$/) {sub("/s", "", $i); print $i; exit}}'; }
printf '%-6s %12s %12s %12s %8s %8s %8s\n' run ceiling A B A/ceil B/ceil B/A
for r in 1 2 3; do
  c=$(rate "$NOOP"); a=$(rate "$A_GRPC"); b=$(rate "$B_GRPC")
  awk -v r="$r" -v c="$c" -v a="$a" -v b="$b" 'BEGIN{printf "%-6s %12.0f %12.0f %12.0f %8.2f %8.2f %8.2f\n", r, c, a, b, a/c, b/c, b/a}'
done
