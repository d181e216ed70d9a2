#!/usr/bin/env bash
# Copies the third-party .proto files Mandate imports out of the Go module
# cache into third_party/, with their licences. No buf registry is involved:
# the Go module proxy is the only network source.
#
# Usage: scripts/vendor-protos.sh   (from the repository root)
set -euo pipefail

PROTOVALIDATE_VERSION=v1.2.2   # validate.proto that protovalidate-go v1.4.0 is generated from
GATEWAY_V1_VERSION=v1.16.0     # last grpc-gateway release that ships google/api/*.proto

moddir() {
  go mod download -json "$1" >/dev/null
  go list -m -f '{{.Dir}}' "$1"
}

root=$(git rev-parse --show-toplevel)
cd "$root"

pv=$(moddir "github.com/bufbuild/protovalidate@${PROTOVALIDATE_VERSION}")
gw=$(moddir "github.com/grpc-ecosystem/grpc-gateway@${GATEWAY_V1_VERSION}")

rm -rf third_party/protovalidate third_party/googleapis
mkdir -p third_party/protovalidate/buf/validate third_party/googleapis/google/api

install -m 0644 "$pv/proto/protovalidate/buf/validate/validate.proto" third_party/protovalidate/buf/validate/
install -m 0644 "$pv/LICENSE" third_party/protovalidate/LICENSE
printf 'github.com/bufbuild/protovalidate %s proto/protovalidate\n' "$PROTOVALIDATE_VERSION" > third_party/protovalidate/SOURCE

for f in annotations.proto http.proto; do
  install -m 0644 "$gw/third_party/googleapis/google/api/$f" third_party/googleapis/google/api/
done
install -m 0644 "$gw/third_party/googleapis/LICENSE" third_party/googleapis/LICENSE
printf 'github.com/grpc-ecosystem/grpc-gateway %s third_party/googleapis\n' "$GATEWAY_V1_VERSION" > third_party/googleapis/SOURCE

echo "vendored: $(find third_party -name '*.proto' | sort | tr '\n' ' ')"
