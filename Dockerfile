# syntax=docker/dockerfile:1
#
# Sluice as a container: `make image` (or `docker build -t sluice .`), then
#
#   docker run --rm -p 8080:8080 -p 8081:8081 sluice
#   docker run --rm -p 8080:8080 -p 8081:8081 -v "$PWD/policy:/etc/sluice/policy:ro" \
#     -e SLUICE_CONFIG=/etc/sluice/policy -e SLUICE_STORE=redis://redis:6379/0 sluice
#
# Two stages: the Go toolchain builds one static binary (CGO_ENABLED=0, through `make build`,
# which e2e's TestBinaryIsStatic checks), and the image ships only that binary on distroless
# static: no shell, no package manager, CA certificates and tzdata only, user nonroot (65532).
# Override the bases with --build-arg to pin digests or use a mirror.

ARG GO_IMAGE=golang:1.26
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${GO_IMAGE} AS build
WORKDIR /src
# Modules first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    make build BIN=/out/sluice VERSION="${VERSION}" \
    && mkdir -p /out/data

FROM ${BASE_IMAGE}
COPY --from=build /out/sluice /sluice
# The memory store's snapshot and the SQLite control store live in the data folder: owned by
# the runtime user, so the root file system can stay read-only (Kubernetes mounts an emptyDir
# or a volume here).
COPY --from=build --chown=65532:65532 /out/data /var/lib/sluice
USER 65532:65532
# Listen on every interface inside the container (the binary's own default is loopback only).
ENV SLUICE_HTTP=0.0.0.0:8080 \
    SLUICE_GRPC=0.0.0.0:8081 \
    SLUICE_DATA_DIR=/var/lib/sluice
# 8080: HTTP JSON API, /healthz, /readyz, /metrics, /admin/v1, and Envoy's /json and
# /healthcheck; 8081: gRPC (sluice.v1, Envoy RLS v3, grpc.health.v1).
EXPOSE 8080 8081
# No shell or curl here: the binary probes itself (`sluice health` GETs /healthz on the port of
# SLUICE_HTTP and exits 0 on 200, 1 otherwise).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 CMD ["/sluice", "health"]
ENTRYPOINT ["/sluice"]
CMD ["serve"]
