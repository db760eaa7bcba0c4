package deploy

import (
	"encoding/base64"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// values parses a values file.
func values(t *testing.T, yml string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValues([]byte(yml))
	if err != nil {
		t.Fatalf("values %q: %v", yml, err)
	}
	return v
}

// TestChart renders the chart with several value sets, as `helm template` would, lints it as
// `helm lint --strict` would, validates every object (types, schemas and validate's checks),
// and checks what each value set is for.
func TestChart(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		values string
		ext    external
		check  func(t *testing.T, r *rendering)
	}{
		{
			name: "defaults",
			check: func(t *testing.T, r *rendering) {
				want := []string{
					"ConfigMap/edge-sluice-policy", "Deployment/edge-sluice", "PodDisruptionBudget/edge-sluice",
					"Secret/edge-sluice", "Service/edge-sluice", "Service/edge-sluice-admin", "Service/edge-sluice-headless", "ServiceAccount/edge-sluice",
				}
				if got := sorted(r.kinds()); !slices.Equal(got, want) {
					t.Errorf("objects %q, want %q", got, want)
				}
				c := r.container(t)
				if p := c.LivenessProbe.HTTPGet; p == nil || p.Path != "/healthz" || p.Port.StrVal != "http" || p.Scheme != corev1.URISchemeHTTP {
					t.Errorf("liveness probe %+v, want GET /healthz on http", c.LivenessProbe)
				}
				if p := c.ReadinessProbe.HTTPGet; p == nil || p.Path != "/readyz" || p.Port.StrVal != "http" {
					t.Errorf("readiness probe %+v, want GET /readyz on http", c.ReadinessProbe)
				}
				for name, want := range map[string]string{
					"SLUICE_HTTP": "0.0.0.0:8080", "SLUICE_GRPC": "0.0.0.0:8081", "SLUICE_ADMIN_HTTP": "0.0.0.0:8082", "SLUICE_CONFIG": "/etc/sluice/policy",
					"SLUICE_DATA_DIR": "/var/lib/sluice", "SLUICE_LOG_FORMAT": "json", "GOMEMLIMIT": "$(SLUICE_MEMORY_LIMIT_MIB)MiB",
				} {
					if e := env(c, name); e == nil || e.Value != want {
						t.Errorf("env %s = %+v, want %q", name, e, want)
					}
				}
				for _, name := range []string{"SLUICE_STORE", "SLUICE_CONTROL", "SLUICE_TLS_CERT", "SLUICE_STATSD", "SLUICE_OTLP_ENDPOINT", "SLUICE_TRACE_SAMPLE_RATIO"} {
					if e := env(c, name); e != nil {
						t.Errorf("env %s set by default: %+v", name, e)
					}
				}
				tok := r.secret("edge-sluice").Data["admin-token"]
				if len(tok) != 40 {
					t.Errorf("generated admin token of %d bytes, want 40", len(tok))
				}
				if r.deployment(t).Spec.Template.Annotations["checksum/secret"] == "" {
					t.Error("no checksum/secret: a new token or URL would not roll the pods")
				}
				if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds != 5 {
					t.Errorf("preStop %+v, want a 5 s sleep", c.Lifecycle)
				}
				// The admin API has its own ClusterIP Service, and the data Service does not
				// route to its port.
				for _, svc := range r.services() {
					for _, p := range svc.Spec.Ports {
						admin := p.TargetPort.StrVal == "admin"
						if admin != (svc.Name == "edge-sluice-admin") {
							t.Errorf("Service %s routes port %s to %s", svc.Name, p.Name, p.TargetPort.StrVal)
						}
						if admin && (svc.Spec.Type != corev1.ServiceTypeClusterIP || p.Port != 8082) {
							t.Errorf("admin Service %s port %d, want a ClusterIP on 8082", svc.Spec.Type, p.Port)
						}
					}
				}
				if !strings.Contains(r.notes, "edge-sluice-headless.rate-limits.svc:8081") || !strings.Contains(r.notes, "get secret edge-sluice") ||
					!strings.Contains(r.notes, "port-forward svc/edge-sluice-admin 8082:8082") {
					t.Errorf("NOTES:\n%s", r.notes)
				}
			},
		},
		{
			name: "Redis, PostgreSQL and an existing Secret",
			values: `
replicaCount: 3
store: {redis: {enabled: true}, hotKeys: true, allowances: true}
control: {postgres: {enabled: true}}
existingSecret: platform-sluice
secretKeys: {storeURL: redis, controlURL: postgres}`,
			ext: external{secret: "platform-sluice"},
			check: func(t *testing.T, r *rendering) {
				if len(r.all("Secret")) != 0 {
					t.Errorf("the chart made a Secret beside existingSecret: %q", r.kinds())
				}
				c := r.container(t)
				for name, key := range map[string]string{"SLUICE_STORE": "redis", "SLUICE_CONTROL": "postgres", "SLUICE_ADMIN_TOKEN": "admin-token"} {
					e := env(c, name)
					if e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
						e.ValueFrom.SecretKeyRef.Name != "platform-sluice" || e.ValueFrom.SecretKeyRef.Key != key {
						t.Errorf("env %s = %+v, want platform-sluice's key %s", name, e, key)
					}
				}
				for name, want := range map[string]string{"SLUICE_FLEET_SIZE": "3", "SLUICE_HOT_KEYS": "true", "SLUICE_ALLOWANCES": "true", "SLUICE_STORE_TIMEOUT": "10ms"} {
					if e := env(c, name); e == nil || e.Value != want {
						t.Errorf("env %s = %+v, want %q", name, e, want)
					}
				}
				if _, ok := r.deployment(t).Spec.Template.Annotations["checksum/secret"]; ok {
					t.Error("checksum/secret of a Secret the chart does not render")
				}
				if strings.Contains(r.notes, "WARNING") {
					t.Errorf("NOTES warn with Redis:\n%s", r.notes)
				}
			},
		},
		{
			name: "Redis and PostgreSQL URLs in the chart's Secret",
			values: `
store: {redis: {enabled: true, url: "redis://:s3cret@redis-master:6379/0"}}
control: {postgres: {enabled: true, url: "postgres://sluice:pw@pg:5432/sluice"}}
adminToken: an-admin-token-of-thirty-two-chars`,
			check: func(t *testing.T, r *rendering) {
				s := r.secret("edge-sluice")
				for key, want := range map[string]string{
					"store-url":   "redis://:s3cret@redis-master:6379/0",
					"control-url": "postgres://sluice:pw@pg:5432/sluice",
					"admin-token": "an-admin-token-of-thirty-two-chars",
				} {
					if got := string(s.Data[key]); got != want {
						t.Errorf("Secret %s = %q, want %q", key, got, want)
					}
				}
				// The URLs carry passwords: in the Secret only, never in the pod spec.
				if d := r.all("Deployment")[0].raw; strings.Contains(d, "s3cret") || strings.Contains(d, base64.StdEncoding.EncodeToString([]byte("s3cret"))) {
					t.Error("the Deployment shows the Redis password")
				}
			},
		},
		{
			name: "ServiceMonitor",
			values: `
serviceMonitor: {enabled: true, labels: {release: kube-prometheus-stack}, interval: 15s}`,
			check: func(t *testing.T, r *rendering) {
				sms := r.all("ServiceMonitor")
				if len(sms) != 1 {
					t.Fatalf("%d ServiceMonitors, want 1", len(sms))
				}
				if !strings.Contains(sms[0].raw, "release: kube-prometheus-stack") || !strings.Contains(sms[0].raw, "interval: 15s") {
					t.Errorf("ServiceMonitor:\n%s", sms[0].raw)
				}
			},
		},
		{
			name:   "no PodDisruptionBudget",
			values: `podDisruptionBudget: {enabled: false}`,
			check: func(t *testing.T, r *rendering) {
				if n := len(r.all("PodDisruptionBudget")); n != 0 {
					t.Errorf("%d PodDisruptionBudgets", n)
				}
			},
		},
		{
			name:   "PodDisruptionBudget by minAvailable",
			values: `{replicaCount: 3, store: {redis: {enabled: true, url: "redis://r:6379"}}, control: {postgres: {enabled: true, url: "postgres://u:p@pg:5432/sluice"}}, podDisruptionBudget: {minAvailable: 2}}`,
			check: func(t *testing.T, r *rendering) {
				if !strings.Contains(r.all("PodDisruptionBudget")[0].raw, "minAvailable: 2") {
					t.Errorf("PDB:\n%s", r.all("PodDisruptionBudget")[0].raw)
				}
			},
		},
		{
			name: "custom resources",
			values: `
# Helm merges maps with the defaults: null drops the default memory limit.
resources: {requests: {cpu: 500m, memory: 128Mi}, limits: {cpu: "2", memory: null}}
dataDir: {sizeLimit: null}`,
			check: func(t *testing.T, r *rendering) {
				c := r.container(t)
				want := corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
				}
				for _, l := range []struct{ got, want corev1.ResourceList }{{c.Resources.Requests, want.Requests}, {c.Resources.Limits, want.Limits}} {
					if len(l.got) != len(l.want) {
						t.Errorf("resources %v, want %v", c.Resources, want)
					}
					for k, v := range l.want {
						if g := l.got[k]; g.Cmp(v) != 0 {
							t.Errorf("resources %s = %s, want %s", k, g.String(), v.String())
						}
					}
				}
				if e := env(c, "GOMEMLIMIT"); e != nil {
					t.Errorf("GOMEMLIMIT without a memory limit: %+v", e)
				}
			},
		},
		{
			name: "mTLS",
			values: `
tls: {enabled: true, secretName: sluice-tls, requireClientCert: true}
serviceMonitor: {enabled: true, tlsConfig: {insecureSkipVerify: true}}
statsd: {address: "statsd.monitoring:8125"}`,
			ext: external{tlsSecret: "sluice-tls"},
			check: func(t *testing.T, r *rendering) {
				c := r.container(t)
				for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
					if p.Exec == nil || !slices.Contains(p.Exec.Command, "--cert-file=/etc/sluice/tls/tls.crt") {
						t.Errorf("probe %+v, want `sluice health` with the pod's certificate", p)
					}
				}
				for name, want := range map[string]string{
					"SLUICE_TLS_CERT": "/etc/sluice/tls/tls.crt", "SLUICE_TLS_KEY": "/etc/sluice/tls/tls.key",
					"SLUICE_TLS_CLIENT_CA": "/etc/sluice/tls/ca.crt", "SLUICE_STATSD": "statsd.monitoring:8125",
				} {
					if e := env(c, name); e == nil || e.Value != want {
						t.Errorf("env %s = %+v, want %q", name, e, want)
					}
				}
				if sm := r.all("ServiceMonitor")[0].raw; !strings.Contains(sm, "scheme: https") || !strings.Contains(sm, "insecureSkipVerify: true") {
					t.Errorf("ServiceMonitor:\n%s", sm)
				}
			},
		},
		{
			name:   "tracing",
			values: `tracing: {endpoint: "otel-collector.monitoring:4317", insecure: true, sampleRatio: 0.25}`,
			check: func(t *testing.T, r *rendering) {
				c := r.container(t)
				for name, want := range map[string]string{
					"SLUICE_OTLP_ENDPOINT": "otel-collector.monitoring:4317", "SLUICE_OTLP_INSECURE": "true", "SLUICE_TRACE_SAMPLE_RATIO": "0.25",
				} {
					if e := env(c, name); e == nil || e.Value != want {
						t.Errorf("env %s = %+v, want %q", name, e, want)
					}
				}
			},
		},
		{
			name:   "TLS without client certificates",
			values: `tls: {enabled: true, secretName: sluice-tls}`,
			ext:    external{tlsSecret: "sluice-tls"},
			check: func(t *testing.T, r *rendering) {
				c := r.container(t)
				if p := c.ReadinessProbe.HTTPGet; p == nil || p.Scheme != corev1.URISchemeHTTPS {
					t.Errorf("readiness probe %+v, want an HTTPS GET", c.ReadinessProbe)
				}
				if e := env(c, "SLUICE_TLS_CLIENT_CA"); e != nil {
					t.Errorf("client CA without requireClientCert: %+v", e)
				}
			},
		},
		{
			name:   "existing ConfigMap",
			values: `policy: {existingConfigMap: envoy-ratelimit-config}`,
			ext:    external{configMap: "envoy-ratelimit-config"},
			check: func(t *testing.T, r *rendering) {
				if n := len(r.all("ConfigMap")); n != 0 {
					t.Errorf("%d ConfigMaps beside existingConfigMap", n)
				}
			},
		},
		{
			name:   "built-in policy",
			values: `policy: {files: null}`,
			check: func(t *testing.T, r *rendering) {
				if n := len(r.all("ConfigMap")); n != 0 {
					t.Errorf("%d ConfigMaps without policy files", n)
				}
				if e := env(r.container(t), "SLUICE_CONFIG"); e != nil {
					t.Errorf("SLUICE_CONFIG without a policy: %+v", e)
				}
			},
		},
		{
			name: "Envoy-format policy",
			values: `
policy:
  files:
    edge.yaml: |
      domain: edge
      descriptors:
        - key: client_id
          rate_limit: {unit: minute, requests_per_unit: 100}`,
		},
		{
			name:   "long names",
			values: `fullnameOverride: ` + strings.Repeat("a", 70),
			check: func(t *testing.T, r *rendering) {
				for _, o := range r.objects {
					if n := o.name(); len(n) > len(o.gvk.Kind)+1+63 {
						t.Errorf("%s: name over 63 characters", n)
					}
				}
			},
		},
		{
			name:   "memory store with several pods warns",
			values: `{replicaCount: 2, control: {postgres: {enabled: true, url: "postgres://u:p@pg:5432/sluice"}}}`,
			check: func(t *testing.T, r *rendering) {
				if !strings.Contains(r.notes, "WARNING: 2 pods on the memory store") {
					t.Errorf("NOTES:\n%s", r.notes)
				}
			},
		},
		{
			name:   "admin API on the http port",
			values: `admin: {separatePort: false}`,
			check: func(t *testing.T, r *rendering) {
				for _, svc := range r.services() {
					if svc.Name == "edge-sluice-admin" {
						t.Error("an admin Service without separatePort")
					}
				}
				if e := env(r.container(t), "SLUICE_ADMIN_HTTP"); e != nil {
					t.Errorf("SLUICE_ADMIN_HTTP set without separatePort: %+v", e)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := values(t, tc.values)
			r, err := render(t, v)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			for _, err := range validate(r, tc.ext) {
				t.Error(err)
			}
			if err := lintChart(v); err != nil {
				t.Errorf("helm lint --strict: %v", err)
			}
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

// TestChartRefusesBadValues: values the chart cannot honour are refused when rendering, with a
// message naming the value, by values.schema.json or by the templates' own checks.
func TestChartRefusesBadValues(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, values, err string }{
		{"misspelt key", `replicas: 2`, "replicas"},
		{"split control plane", `{replicaCount: 2, store: {redis: {enabled: true, url: "redis://r:6379"}}}`, "control.postgres.enabled"},
		{"admin port", `admin: {service: {port: 0}}`, "port"},
		{"misspelt nested key", `store: {redis: {enable: true}}`, "enable"},
		{"Redis without its URL", `store: {redis: {enabled: true}}`, "store.redis.url is required"},
		{"PostgreSQL without its URL", `control: {postgres: {enabled: true}}`, "control.postgres.url is required"},
		{"not a Redis URL", `store: {redis: {enabled: true, url: "http://redis:6379"}}`, "url"},
		{"log level", `logLevel: verbose`, "logLevel"},
		{"TLS without its Secret", `tls: {enabled: true}`, "tls.secretName is required"},
		{"policy file not YAML", `policy: {files: {policy.json: "{}"}}`, "policy.json"},
		{"digest", `image: {digest: latest}`, "digest"},
		{"port", `service: {grpcPort: 70000}`, "grpcPort"},
		{"duration", `store: {timeout: 10}`, "timeout"},
		{"probe path", `readinessProbe: {path: readyz}`, "path"},
		{"name", `fullnameOverride: Edge_Sluice`, "fullnameOverride"},
		{"trace sample ratio", `tracing: {endpoint: "c:4317", sampleRatio: 2}`, "sampleRatio"},
		{"trace endpoint", `tracing: {endpoint: "collector"}`, "endpoint"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := render(t, values(t, tc.values))
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err %v, want one naming %q", err, tc.err)
			}
		})
	}
}

// TestLintReports: lintChart is Helm's linter, not a formality: it reports what it finds.
func TestLintReports(t *testing.T) {
	t.Parallel()
	if err := lintChart(values(t, `replicas: 3`)); err == nil || !strings.Contains(err.Error(), "replicas") {
		t.Fatalf("lint of a misspelt key: %v", err)
	}
}

// TestValidateCatchesMistakes: validate is not vacuous. Each case breaks one thing in a
// rendered release, as a template mistake would, and validate names it.
func TestValidateCatchesMistakes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		patch func(t *testing.T, r *rendering)
		err   string
	}{
		{"Service targets a missing port", func(t *testing.T, r *rendering) {
			r.services()[0].Spec.Ports[0].TargetPort.StrVal = "web"
		}, "targets web"},
		{"Service selects no pod", func(t *testing.T, r *rendering) {
			r.services()[0].Spec.Selector["app.kubernetes.io/instance"] = "other"
		}, "does not select the pods"},
		{"Secret key missing", func(t *testing.T, r *rendering) {
			delete(r.secret("edge-sluice").Data, "admin-token")
		}, "has no key admin-token"},
		{"probe on an unnamed port", func(t *testing.T, r *rendering) {
			r.container(t).LivenessProbe.HTTPGet.Port.StrVal = "metrics"
		}, "liveness probe port metrics"},
		{"policy that does not load", func(t *testing.T, r *rendering) {
			r.configMap("edge-sluice-policy").Data["policy.yaml"] = "rules: [{name: x, limit: 0}]"
		}, "the policy does not load"},
		{"policy mounted with subPath", func(t *testing.T, r *rendering) {
			c := r.container(t)
			for i := range c.VolumeMounts {
				if c.VolumeMounts[i].Name == "policy" {
					c.VolumeMounts[i].SubPath = "policy.yaml"
				}
			}
		}, "subPath"},
		{"writable root", func(t *testing.T, r *rendering) {
			f := false
			r.container(t).SecurityContext.ReadOnlyRootFilesystem = &f
		}, "root file system is writable"},
		{"request over limit", func(t *testing.T, r *rendering) {
			r.container(t).Resources.Requests[corev1.ResourceMemory] = resource.MustParse("1Gi")
		}, "over its limit"},
		{"label value too long", func(t *testing.T, r *rendering) {
			r.services()[1].Labels["x"] = strings.Repeat("v", 64)
		}, "label x="},
		{"env refers to a later variable", func(t *testing.T, r *rendering) {
			c := r.container(t)
			c.Env = append([]corev1.EnvVar{{Name: "A", Value: "$(SLUICE_HTTP)"}}, c.Env...)
		}, "refers to $(SLUICE_HTTP)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := render(t, nil)
			if err != nil {
				t.Fatal(err)
			}
			if errs := validate(r, external{}); len(errs) != 0 {
				t.Fatalf("the defaults do not validate: %v", errs)
			}
			tc.patch(t, r)
			errs := validate(r, external{})
			if !slices.ContainsFunc(errs, func(e error) bool { return strings.Contains(e.Error(), tc.err) }) {
				t.Fatalf("errors %v, want one naming %q", errs, tc.err)
			}
		})
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestDecodeRefuses: the decoding of rendered documents is as strict as the API server's
// field validation: an unknown or repeated field, a wrong type or a kind the chart is not
// meant to render is an error.
func TestDecodeRefuses(t *testing.T) {
	t.Parallel()
	const head = "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: rate-limits}\n"
	tests := []struct{ name, doc, err string }{
		{"unknown field", head + "spec: {ports: [{port: 80, targetPort: http, appProtocl: http}]}\n", "appProtocl"},
		{"field twice", head + "spec: {type: ClusterIP, type: NodePort}\n", "type"},
		{"wrong type", head + "spec: {ports: [{port: eighty}]}\n", "port"},
		{"unknown kind", "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: i}\n", "Ingress"},
		{"bad quantity", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, image: i, resources: {limits: {memory: lots}}}]}\n", "quantities"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := decode("test", tc.doc); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err %v, want one naming %q", err, tc.err)
			}
		})
	}
}
