// Package e2e builds the real sluice binary and drives it over loopback: HTTP, gRPC (sluice.v1
// and Envoy RLS v3), the admin API and dashboard, policy reload, regions, fleets on Redis and
// PostgreSQL, and SIGTERM or SIGKILL with a restart. It holds tests only.
package e2e
