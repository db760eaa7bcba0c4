//go:build race

package follower_test

// raceEnabled: the race detector makes the scale tests' imports of 100,000 entries run for
// many minutes; scripts/test.sh runs them without it (docs/testing.md).
const raceEnabled = true
