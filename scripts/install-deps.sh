#!/usr/bin/env bash
# Installs what the test suite needs when it is missing, so `make test` passes on a fresh
# machine. Uses Debian's packages; needs root (or sudo) only when something is missing.
set -euo pipefail

need=()
command -v go >/dev/null || { echo "install-deps: Go is required (https://go.dev/dl)"; exit 1; }
for tool in redis-server redis-cli; do
  command -v "$tool" >/dev/null || { need+=(redis-server); break; }
done
# The PostgreSQL server (internal/testkit/pgtest runs initdb and postgres). Debian keeps them off PATH,
# in /usr/lib/postgresql/VERSION/bin; pgtest looks there first, then on PATH.
has_postgres() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && return 0
  done
  command -v initdb >/dev/null && command -v postgres >/dev/null
}
has_postgres || need+=(postgresql)
# etcd, for the etcd policy source's tests (internal/testkit/etcdtest runs a one-member cluster).
command -v etcd >/dev/null || need+=(etcd-server)
# promtool checks the alerting rules in deploy/prometheus (Debian ships it with the server).
command -v promtool >/dev/null || need+=(prometheus)
# Headless chromium for the dashboard's browser tests (e2e TestDashboard, driven by chromedp),
# with a font so that its screenshots have text.
command -v chromium >/dev/null || need+=(chromium fonts-dejavu-core)
# curl runs the README's commands in e2e TestReadmeCommands, as a reader pastes them.
command -v curl >/dev/null || need+=(curl)

if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install-deps: installing ${need[*]} from apt"
  $sudo apt-get update -qq
  # RUNLEVEL=1: install the servers' packages without starting them as services; the tests
  # start their own throwaway servers on free loopback ports.
  $sudo env RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
