#!/usr/bin/env bash
# The whole test suite: formatting, vet, race-enabled unit, fuzz-seed and end-to-end tests (the
# latter build and run the real binary), and a compile check of the benchmarks module.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh
# install-deps put redis-server, the PostgreSQL server, etcd, chromium and curl here: a Redis,
# PostgreSQL, etcd, browser or README test that cannot find them is a failure, not a skip.
export SLUICE_REQUIRE_REDIS=1
export SLUICE_REQUIRE_POSTGRES=1
export SLUICE_REQUIRE_ETCD=1
export SLUICE_REQUIRE_CHROMIUM=1
export SLUICE_REQUIRE_CURL=1

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt would change:"; echo "$unformatted"; exit 1; fi

echo "== layers"
./scripts/layers.sh

echo "== go vet"
go vet ./...
(cd benchmarks && go vet ./...)

echo "== promtool check rules"
promtool check rules deploy/prometheus/alerts.yaml

echo "== go test -race"
go test -race -count=1 -timeout 20m ./...

# The control plane's scale tests import 100,000 entries and more: under the race detector
# that alone runs for many minutes, so they skip there and run here, without it.
echo "== go test, the control plane at scale"
go test -count=1 -timeout 20m -run '^TestScale' -v ./control/follower/

# The Helm chart (rendered as `helm template` does with several value sets, linted as
# `helm lint --strict`, every object validated against the Kubernetes API's types and
# schemas offline) and the Dockerfile. Its own module, so that the main one does not depend on
# Helm and Kubernetes; compiling that graph cold takes about two minutes on two cores.
echo "== deploy"
(cd deploy && go vet ./... && go test -count=1 ./...)
