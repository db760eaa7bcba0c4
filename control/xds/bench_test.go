package xds_test

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/control/xds"
	"github.com/sluicehq/sluice/internal/testkit/xdstest"
	"github.com/sluicehq/sluice/policy"
)

// BenchmarkPushToApply measures one configuration change end to end against go-control-plane's
// server on loopback: from SetSnapshot to the parsed policy handed to Apply (what the node
// then swaps in), ACK included in the next round.
func BenchmarkPushToApply(b *testing.B) {
	srv := xdstest.Start(b)
	const node = "bench"
	applied := make(chan string, 1)
	c, err := xds.New(xds.Options{
		Server: srv.Addr, NodeID: node, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Apply: func(version string, docs map[string][]byte) error {
			if _, err := policy.ParseFiles(docs); err != nil {
				return err
			}
			applied <- version
			return nil
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); c.Run(ctx) }()
	defer func() { cancel(); <-ran; c.Close() }()
	srv.Set(node, "warm", xdstest.Config("edge", "edge", 1, [2]string{"path", "/a"}))
	<-applied
	b.ResetTimer()
	for i := range b.N {
		v := strconv.Itoa(i)
		srv.Set(node, v, xdstest.Config("edge", "edge", uint32(i+2), [2]string{"path", "/a"}))
		for got := <-applied; got != v; got = <-applied {
		}
	}
}
