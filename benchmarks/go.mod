module github.com/sluicehq/sluice/benchmarks

go 1.26.0

require github.com/sluicehq/sluice v0.0.0

require (
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/time v0.16.0
)

replace github.com/sluicehq/sluice => ../
