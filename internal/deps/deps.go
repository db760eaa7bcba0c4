// Package deps pins the modules the servers need while they are written; delete it once
// they import them.
package deps

import (
	_ "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	_ "github.com/fsnotify/fsnotify"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/spf13/cobra"
	_ "google.golang.org/grpc"
	_ "google.golang.org/grpc/health"
	_ "google.golang.org/grpc/reflection"
	_ "google.golang.org/protobuf/proto"
)
