# make run   - the service on its embedded default (memory store, built-in policy)
# make test  - the whole test suite, ~18 minutes on 2 cores (scripts/install-deps.sh installs
#              redis-server, postgresql, etcd-server, prometheus, chromium, fonts-dejavu-core and
#              curl from apt when missing)
# make bench - the Check benchmarks against x/time/rate and a mutex+map bucket
# make image - the container image (Dockerfile), when a Docker engine answers
.PHONY: run test bench build proto image

# CGO_ENABLED=0: one static binary (no libc, no dynamic loader) that runs in a scratch or
# distroless image; e2e's TestBinaryIsStatic builds it with BIN=elsewhere and checks it.
# -trimpath keeps the build machine's paths out of the binary; VERSION is what
# `sluice version` prints (the Dockerfile passes its VERSION build argument).
BIN ?= bin/sluice
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
build:
	CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/sluice

# IMAGE names the image; a missing docker client or engine is said plainly, not as a
# "command not found" or a socket error.
IMAGE ?= sluice:$(VERSION)
image:
	@command -v docker >/dev/null 2>&1 || { echo "make image: docker is not installed (the image needs a Docker engine; 'make build' makes the static binary without one)" >&2; exit 1; }
	@docker info >/dev/null 2>&1 || { echo "make image: no Docker engine answers ('docker info' failed): start one, or set DOCKER_HOST ('make build' makes the static binary without one)" >&2; exit 1; }
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE) .

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
