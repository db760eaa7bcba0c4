package deploy

import (
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	"github.com/sluicehq/sluice/policy"
)

func TestX(t *testing.T) {
	_ = loader.Load
	_ = chartutil.ToRenderValues
	_ = engine.Render
	_ = appsv1.Deployment{}
	_ = corev1.Service{}
	_ = policyv1.PodDisruptionBudget{}
	_ = monitoringv1.ServiceMonitor{}
	_ = runtime.NewScheme
	_ = serializer.EnableStrict
	_ = policy.LoadFiles
}
