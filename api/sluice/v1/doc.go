// Package sluicev1 is Sluice's native gRPC API, sluice.v1.RateLimiter: Check, GetQuota and
// Reset, mirroring the JSON API. The code beside this file is generated from sluice.proto by
// scripts/genproto.sh; the server is in server/grpcapi.
package sluicev1
