# make run   - the service on its embedded default (memory store, built-in policy)
# make test  - the whole test suite (installs redis-server and postgresql from apt when missing)
# make bench - the Check benchmarks against x/time/rate and a mutex+map bucket
.PHONY: run test bench build proto

# CGO_ENABLED=0: one static binary (no libc, no dynamic loader) that runs in a scratch or
# distroless image; e2e's TestBinaryIsStatic builds it with BIN=elsewhere and checks it.
BIN ?= bin/sluice
build:
	CGO_ENABLED=0 go build -o $(BIN) ./cmd/sluice

run:
	go run ./cmd/sluice serve

test:
	./scripts/test.sh

bench:
	cd benchmarks && go test -run '^$$' -bench . -benchmem
	go test -run '^$$' -bench . -benchmem ./algorithm/
	go test -run '^$$' -bench MemoryPerKey -benchtime 1x ./store/memory/

proto:
	./scripts/genproto.sh
