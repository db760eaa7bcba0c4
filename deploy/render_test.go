package deploy

import (
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/client-go/applyconfigurations"
	"sigs.k8s.io/yaml"
)

// The release the tests render, as `helm template edge deploy/helm/sluice -n rate-limits`.
const (
	chartDir  = "helm/sluice"
	release   = "edge"
	namespace = "rate-limits"
)

// kubeVersion is the cluster version the chart is rendered for: the oldest its Chart.yaml
// accepts would do as well; this one is a current release.
var kubeVersion = chartutil.KubeVersion{Version: "v1.31.0", Major: "1", Minor: "31"}

// scheme knows the kinds the chart may render. A kind it does not know fails the test: a
// template that produced one was not meant to.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{appsv1.AddToScheme, corev1.AddToScheme, policyv1.AddToScheme, monitoringv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// strict decodes YAML into the kinds' Go types as the API server's strict field validation
// does (kubectl apply --validate=strict): a field the type does not have, a field given twice
// or a value of the wrong type is an error, not silently dropped.
var strict = serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()

// schemas validates built-in kinds against the OpenAPI schemas of the Kubernetes API that
// client-go embeds (the ones server-side apply uses): no network, and no schema files to fetch.
// kubeconform would need its schemas downloaded from GitHub when it runs, which this project's
// machines and CI cannot do. The ServiceMonitor, a CRD, has no schema there: it is decoded
// strictly into the Prometheus Operator's Go types and its fields checked by validate.
var schemas managedfields.TypeConverter = applyconfigurations.NewTypeConverter(scheme)

// object is one rendered document.
type object struct {
	source string         // the template it came from
	raw    string         // its YAML
	obj    runtime.Object // decoded into its Go type
	gvk    schema.GroupVersionKind
}

func (o object) name() string {
	return o.gvk.Kind + "/" + o.obj.(interface{ GetName() string }).GetName()
}

// rendering is a rendered release.
type rendering struct {
	objects []object
	notes   string
}

// loadChart loads the chart once.
var loadChart = sync.OnceValues(func() (*chart.Chart, error) { return loader.Load(chartDir) })

// render renders the chart with values as `helm template` does (values coalesced with
// values.yaml and checked against values.schema.json, templates rendered with missing keys an
// error, as `helm lint --strict` renders them), then decodes and validates every document
// strictly. It returns an error for what Helm refuses, and fails t for what Kubernetes would.
//
// It calls the chart loader, chartutil and the template engine itself rather than
// action.Install with DryRun and ClientOnly: those are what that action runs to render, and
// the action package would bring Helm's Kubernetes client, registry and storage into the
// build, doubling this module's compile time for nothing the test uses.
func render(t *testing.T, values map[string]any) (*rendering, error) {
	t.Helper()
	chrt, err := loadChart()
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	if !chartutil.IsCompatibleRange(chrt.Metadata.KubeVersion, kubeVersion.Version) {
		t.Fatalf("Chart.yaml's kubeVersion %q refuses Kubernetes %s", chrt.Metadata.KubeVersion, kubeVersion.Version)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = kubeVersion
	vals, err := chartutil.ToRenderValues(chrt, values, chartutil.ReleaseOptions{
		Name: release, Namespace: namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, err
	}
	files, err := engine.Engine{Strict: true}.Render(chrt, vals)
	if err != nil {
		return nil, err
	}
	r := &rendering{}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		content := files[name]
		switch {
		case strings.HasSuffix(name, "NOTES.txt"):
			r.notes = content
			continue
		case strings.HasPrefix(path.Base(name), "_"):
			continue
		}
		docs := releaseutil.SplitManifests(content)
		keys := make([]string, 0, len(docs))
		for k := range docs {
			keys = append(keys, k)
		}
		sort.Sort(releaseutil.BySplitManifestsOrder(keys))
		for _, k := range keys {
			doc := docs[k]
			if isEmptyYAML(doc) {
				continue
			}
			o, err := decode(name, doc)
			if err != nil {
				t.Errorf("%s:\n%v\n---\n%s", name, err, numbered(doc))
				continue
			}
			r.objects = append(r.objects, o)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return r, nil
}

// decode decodes one document strictly into its Go type and, for built-in kinds, validates it
// against the Kubernetes API's schema.
func decode(source, doc string) (object, error) {
	obj, gvk, err := strict.Decode([]byte(doc), nil, nil)
	if err != nil {
		return object{}, fmt.Errorf("strict decoding: %w", err)
	}
	o := object{source: source, raw: doc, obj: obj, gvk: *gvk}
	if gvk.Group == monitoringv1.SchemeGroupVersion.Group {
		return o, nil
	}
	js, err := yaml.YAMLToJSONStrict([]byte(doc))
	if err != nil {
		return o, fmt.Errorf("YAML: %w", err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(js); err != nil {
		return o, fmt.Errorf("unstructured: %w", err)
	}
	if _, err := schemas.ObjectToTyped(u); err != nil {
		return o, fmt.Errorf("schema of %s: %w", gvk, err)
	}
	return o, nil
}

// isEmptyYAML tells whether doc holds only white space and comments (a template that rendered
// nothing).
func isEmptyYAML(doc string) bool {
	for _, line := range strings.Split(doc, "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

func numbered(doc string) string {
	lines := strings.Split(doc, "\n")
	for i := range lines {
		lines[i] = fmt.Sprintf("%3d  %s", i+1, lines[i])
	}
	return strings.Join(lines, "\n")
}

// lintChart runs Helm's linter with values, as `helm lint --strict --kube-version` does: any
// warning fails.
func lintChart(values map[string]any) error {
	kv := kubeVersion
	linter := lint.AllWithKubeVersion(chartDir, values, namespace, &kv)
	var errs []error
	for _, m := range linter.Messages {
		if m.Severity >= support.WarningSev {
			errs = append(errs, errors.New(m.Error()))
		}
	}
	return errors.Join(errs...)
}

// Typed accessors.

func (r *rendering) all(kind string) []object {
	var out []object
	for _, o := range r.objects {
		if o.gvk.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

func (r *rendering) deployment(t *testing.T) *appsv1.Deployment {
	t.Helper()
	ds := r.all("Deployment")
	if len(ds) != 1 {
		t.Fatalf("%d Deployments, want 1", len(ds))
	}
	return ds[0].obj.(*appsv1.Deployment)
}

func (r *rendering) container(t *testing.T) *corev1.Container {
	t.Helper()
	d := r.deployment(t)
	if n := len(d.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("%d containers, want 1", n)
	}
	return &d.Spec.Template.Spec.Containers[0]
}

func (r *rendering) secret(name string) *corev1.Secret {
	for _, o := range r.all("Secret") {
		if s := o.obj.(*corev1.Secret); s.Name == name {
			return s
		}
	}
	return nil
}

func (r *rendering) configMap(name string) *corev1.ConfigMap {
	for _, o := range r.all("ConfigMap") {
		if c := o.obj.(*corev1.ConfigMap); c.Name == name {
			return c
		}
	}
	return nil
}

func (r *rendering) services() []*corev1.Service {
	var out []*corev1.Service
	for _, o := range r.all("Service") {
		out = append(out, o.obj.(*corev1.Service))
	}
	return out
}

func (r *rendering) kinds() []string {
	var out []string
	for _, o := range r.objects {
		out = append(out, o.name())
	}
	return out
}

// env returns the container's variable name, or nil.
func env(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}
