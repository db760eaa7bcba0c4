package node

import (
	"testing"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/telemetry/usage"
)

// The recorder cuts values to the control store's bounds; if they drifted apart, the store
// would refuse a whole flush of counts.
func TestUsageBoundsAreTheStores(t *testing.T) {
	if usage.MaxNameLen != control.MaxNameLen || usage.MaxValueLen != control.MaxValueLen {
		t.Errorf("usage bounds %d/%d, control store's %d/%d", usage.MaxNameLen, usage.MaxValueLen, control.MaxNameLen, control.MaxValueLen)
	}
}
