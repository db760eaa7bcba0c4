# make run   - the service on its embedded default (memory store, built-in policy)
# make test  - the whole test suite (installs redis-server and postgresql from apt when missing)
# make bench - the Check benchmarks against x/time/rate and a mutex+map bucket
.PHONY: run test bench build proto

build:
	go build -o bin/sluice ./cmd/sluice

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
