// Package sluicev1 is Sluice's native gRPC API, sluice.v1.RateLimiter: Check, GetQuota and
// Reset, mirroring the JSON API; and sluice.v1.Regions, which regions speak to each other
// (Sync, Decide). The code beside this file is generated from sluice.proto and regions.proto
// by scripts/genproto.sh; the servers are in transport/grpcapi and region.
package sluicev1
