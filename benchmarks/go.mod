module github.com/sluicehq/sluice/benchmarks

go 1.26.0

require (
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redis/rueidis v1.0.79
	github.com/sluicehq/sluice v0.0.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-json-experiment/json v1.27.2 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

require (
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/time v0.16.0
)

replace github.com/sluicehq/sluice => ../
