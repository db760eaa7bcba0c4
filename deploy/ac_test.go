package deploy

import (
	"testing"

	"k8s.io/client-go/applyconfigurations"
)

func TestY(t *testing.T) { _ = applyconfigurations.NewTypeConverter }
