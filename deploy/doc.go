// Package deploy holds the tests of Sluice's deployment artefacts: the Helm chart under
// helm/sluice (rendered as `helm template` renders it, linted as `helm lint --strict` does, and
// every object checked against the Kubernetes API's types and schemas, offline) and the
// container image built by the Dockerfile at the repository's root.
//
// It is a module of its own, as benchmarks/ is: Helm and the Kubernetes API types are a large
// module graph that the main module, and so its users, must not depend on. Run its tests with
//
//	cd deploy && go test ./...
package deploy
