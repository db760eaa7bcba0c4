#!/usr/bin/env bash
# The layer check: no import runs up or across the layers of docs/architecture.md ("Layout").
# For each layer it lists the packages that its packages build on (go list -deps, tests left
# out) and fails on any that the layer must not use:
#   engine     (root, algorithm, policy, store, httplimit, shipped internal) — nothing above it,
#              no SQL driver, no etcd client, no Prometheus client;
#   stores     (store/...) — besides, no gRPC: a decorator that talks to peers (store/region)
#              declares the link it calls, and transport/ implements it;
#   transport  (transport/...) — not the control plane;
#   control    (control/...)   — not telemetry, not the transports;
#   telemetry  (telemetry/...) — not the control plane, not the transports;
#   node       (the composition root) — everything, but not cmd.
set -euo pipefail
cd "$(dirname "$0")/.."

m=$(go list -m)
fail=0

# check LAYER PACKAGES... -- FORBIDDEN-REGEX: every dependency of PACKAGES that matches the
# regex is an error.
check() {
  local layer=$1 forbidden=$2; shift 2
  local bad
  bad=$(go list -deps -f '{{.ImportPath}}' "$@" | grep -E "$forbidden" || true)
  if [ -n "$bad" ]; then
    echo "layers: $layer imports what it must not:"
    local p
    for p in $(go list "$@"); do
      local d
      d=$(go list -deps -f '{{.ImportPath}}' "$p" | grep -E "$forbidden" || true)
      [ -n "$d" ] && echo "  $p -> $(echo "$d" | tr '\n' ' ')"
    done
    fail=1
  fi
}

above_engine="^$m/(cmd|node|transport|control|telemetry|e2e|api)(/|$)"
drivers='^(modernc\.org/sqlite|github\.com/jackc/pgx|database/sql|go\.etcd\.io/)'
# Metrics are exported above the engine (telemetry/, the transports), which read the figures
# the engine's packages expose (hotkey.Stats, region.Stats).
prometheus='^github\.com/prometheus/'
engine=(. ./algorithm ./policy/... ./store/... ./httplimit)
for p in $(go list -f '{{.ImportPath}}' ./internal/... | grep -v "/internal/testkit/"); do engine+=("$p"); done
check engine "$above_engine|$drivers|$prometheus" "${engine[@]}"
# internal/grpcdecode, a helper of the gRPC transports, builds on grpc; the stores do not.
check stores '^google\.golang\.org/grpc(/|$)' ./store/...
check transport "^$m/(cmd|node|control)(/|$)" ./transport/...
check control "^$m/(cmd|node|transport|telemetry)(/|$)" ./control/...
check telemetry "^$m/(cmd|node|transport|control)(/|$)" ./telemetry/...
if [ -d node ]; then check node "^$m/cmd(/|$)" ./node/...; fi
# Shipped code never builds on the test harness.
check shipped "^$m/internal/testkit/" $(go list ./... | grep -v -e "/internal/testkit/" -e "/e2e$" -e "/control/controltest$")

if [ "$fail" -ne 0 ]; then
  echo "layers: see docs/architecture.md, Layout"
  exit 1
fi
echo "layers: ok"
