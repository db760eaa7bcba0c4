#!/usr/bin/env bash
# Installs what the test suite needs when it is missing, so `make test` passes on a fresh
# machine. Uses Debian's packages; needs root (or sudo) only when something is missing.
set -euo pipefail

need=()
command -v go >/dev/null || { echo "install-deps: Go is required (https://go.dev/dl)"; exit 1; }
for tool in redis-server redis-cli; do
  command -v "$tool" >/dev/null || { need+=(redis-server); break; }
done
# The PostgreSQL server (internal/pgtest runs initdb and postgres). Debian keeps them off PATH,
# in /usr/lib/postgresql/VERSION/bin; pgtest looks there first, then on PATH.
has_postgres() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && return 0
  done
  command -v initdb >/dev/null && command -v postgres >/dev/null
}
has_postgres || need+=(postgresql)
# etcd, for the etcd policy source's tests (internal/etcdtest runs a one-member cluster).
command -v etcd >/dev/null || need+=(etcd-server)

if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install-deps: installing ${need[*]} from apt"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
