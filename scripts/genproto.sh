#!/usr/bin/env bash
# genproto.sh regenerates the Go code of Sluice's protobuf APIs (api/**/*.proto) in place.
#
# It installs what it needs when missing: protoc from Debian's protobuf-compiler package (as
# root, with apt-get), and the Go plugins with go install into a temporary GOBIN, so the
# plugins match the pinned versions below and nothing is left on PATH afterwards.
#
# Usage: scripts/genproto.sh
set -euo pipefail

# protoc-gen-go must match the google.golang.org/protobuf version in go.mod: the generated code
# calls runtime functions of that version.
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

want=$(go list -m -f '{{.Version}}' google.golang.org/protobuf)
if [[ "$want" != "$PROTOC_GEN_GO_VERSION" ]]; then
	echo "genproto: go.mod has google.golang.org/protobuf $want but this script pins protoc-gen-go $PROTOC_GEN_GO_VERSION; update the script" >&2
	exit 1
fi

if ! command -v protoc >/dev/null 2>&1; then
	if [[ $(id -u) -ne 0 ]]; then
		echo "genproto: protoc is missing; install protobuf-compiler (needs root)" >&2
		exit 1
	fi
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y protobuf-compiler
fi

gobin=$(mktemp -d)
trap 'rm -rf "$gobin"' EXIT
# Outside the module, so installing the plugins never touches go.mod or go.sum.
# One go install per plugin: go install takes a single module@version per call.
(cd "$gobin" && export GOBIN="$gobin" GOFLAGS= &&
	go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION" &&
	go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION")

# api/ is the proto root, so a file registers as sluice/v1/sluice.proto: the path other protos
# import it by, matching its package.
mapfile -t protos < <(cd api && find . -name '*.proto' -printf '%P\n' | sort)
if [[ ${#protos[@]} -eq 0 ]]; then
	echo "genproto: no .proto files under api/" >&2
	exit 1
fi

echo "genproto: $(protoc --version), protoc-gen-go $PROTOC_GEN_GO_VERSION, protoc-gen-go-grpc $PROTOC_GEN_GO_GRPC_VERSION"
# paths=source_relative writes each .pb.go beside its .proto.
(cd api && PATH="$gobin:$PATH" protoc \
	--proto_path=. \
	--go_out=. --go_opt=paths=source_relative \
	--go-grpc_out=. --go-grpc_opt=paths=source_relative \
	"${protos[@]}")

for p in "${protos[@]}"; do
	echo "genproto: generated api/${p%.proto}.pb.go api/${p%.proto}_grpc.pb.go"
done
