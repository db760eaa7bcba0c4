package deploy

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sluicehq/sluice/policy"
)

// external names what a release refers to without rendering it: the user's own Secret,
// ConfigMap and TLS Secret.
type external struct {
	secret, configMap, tlsSecret string
}

// validate checks what the types and schemas cannot: that the objects of a release fit
// together and would run. Names and labels are valid; selectors select the pods; every port,
// probe, Secret key, ConfigMap and volume referred to exists; the pod runs as non-root on a
// read-only root with its data folder writable; requests fit under limits; the policy in the
// ConfigMap is one Sluice accepts. It returns every problem, each naming its object.
func validate(r *rendering, ext external) []error {
	var errs []error
	fail := func(o string, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", o, fmt.Sprintf(format, args...)))
	}

	seen := map[string]bool{}
	for _, o := range r.objects {
		m := o.obj.(metav1.Object)
		if seen[o.name()] {
			fail(o.name(), "rendered twice")
		}
		seen[o.name()] = true
		if m.GetNamespace() != namespace {
			fail(o.name(), "namespace %q, want the release's %q", m.GetNamespace(), namespace)
		}
		nameErrs := validation.IsDNS1123Subdomain(m.GetName())
		if o.gvk.Kind == "Service" {
			nameErrs = validation.IsDNS1035Label(m.GetName())
		}
		for _, e := range nameErrs {
			fail(o.name(), "name: %s", e)
		}
		for k, v := range m.GetLabels() {
			for _, e := range append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...) {
				fail(o.name(), "label %s=%s: %s", k, v, e)
			}
		}
		for k := range m.GetAnnotations() {
			for _, e := range validation.IsQualifiedName(k) {
				fail(o.name(), "annotation %s: %s", k, e)
			}
		}
	}

	ds := r.all("Deployment")
	if len(ds) != 1 {
		return append(errs, fmt.Errorf("%d Deployments, want 1", len(ds)))
	}
	d := ds[0].obj.(*appsv1.Deployment)
	dn := ds[0].name()
	pod := &d.Spec.Template
	podLabels := labels.Set(pod.Labels)
	if sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector); err != nil || sel.Empty() || !sel.Matches(podLabels) {
		fail(dn, "selector %v does not select its pods %v (%v)", d.Spec.Selector, pod.Labels, err)
	}
	if len(pod.Spec.Containers) == 0 {
		return append(errs, fmt.Errorf("%s: no container", dn))
	}

	// Volumes and what they refer to.
	volumes := map[string]*corev1.Volume{}
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		if volumes[v.Name] != nil {
			fail(dn, "volume %s twice", v.Name)
		}
		volumes[v.Name] = v
		switch {
		case v.ConfigMap != nil:
			if r.configMap(v.ConfigMap.Name) == nil && v.ConfigMap.Name != ext.configMap {
				fail(dn, "volume %s: ConfigMap %s is neither rendered nor the user's", v.Name, v.ConfigMap.Name)
			}
		case v.Secret != nil:
			if r.secret(v.Secret.SecretName) == nil && v.Secret.SecretName != ext.tlsSecret {
				fail(dn, "volume %s: Secret %s is neither rendered nor the user's", v.Name, v.Secret.SecretName)
			}
		}
	}

	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		fail(dn, "the pods mount a service account token; Sluice does not call the API")
	}
	if sas := r.all("ServiceAccount"); len(sas) > 0 && !slices.ContainsFunc(sas, func(o object) bool {
		return o.obj.(*corev1.ServiceAccount).Name == pod.Spec.ServiceAccountName
	}) {
		fail(dn, "serviceAccountName %q is not the rendered ServiceAccount", pod.Spec.ServiceAccountName)
	}
	if psc := pod.Spec.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		fail(dn, "the pod may run as root: %+v", psc)
	}

	for ci := range pod.Spec.Containers {
		c := &pod.Spec.Containers[ci]
		cn := fmt.Sprintf("%s container %s", dn, c.Name)
		if c.Image == "" || !(strings.Contains(c.Image, ":") || strings.Contains(c.Image, "@")) {
			fail(cn, "image %q has no tag or digest", c.Image)
		}
		ports := map[string]int32{}
		for _, p := range c.Ports {
			if _, dup := ports[p.Name]; dup {
				fail(cn, "port name %s twice", p.Name)
			}
			ports[p.Name] = p.ContainerPort
		}

		// Environment: unique names, $(VAR) only of earlier variables, Secret keys that exist.
		defined := map[string]bool{}
		for _, e := range c.Env {
			if defined[e.Name] {
				fail(cn, "env %s twice", e.Name)
			}
			for _, ref := range regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).FindAllStringSubmatch(e.Value, -1) {
				if !defined[ref[1]] {
					fail(cn, "env %s refers to $(%s), not defined before it", e.Name, ref[1])
				}
			}
			defined[e.Name] = true
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				continue
			}
			ref := e.ValueFrom.SecretKeyRef
			if s := r.secret(ref.Name); s != nil {
				if len(s.Data[ref.Key]) == 0 && s.StringData[ref.Key] == "" {
					fail(cn, "env %s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
				}
			} else if ref.Name != ext.secret {
				fail(cn, "env %s: Secret %s is neither rendered nor the user's", e.Name, ref.Name)
			}
		}

		// Mounts: of volumes that exist; the data folder a writable emptyDir; the policy folder
		// mounted whole (the kubelet never updates a subPath mount).
		mounts := map[string]corev1.VolumeMount{}
		for _, m := range c.VolumeMounts {
			if volumes[m.Name] == nil {
				fail(cn, "mount of volume %s, which the pod lacks", m.Name)
			}
			mounts[m.MountPath] = m
		}
		if dir := env(c, "SLUICE_DATA_DIR"); dir == nil {
			fail(cn, "no SLUICE_DATA_DIR")
		} else if m, ok := mounts[dir.Value]; !ok || m.ReadOnly || volumes[m.Name] == nil || volumes[m.Name].EmptyDir == nil {
			fail(cn, "SLUICE_DATA_DIR %s is not a writable emptyDir mount", dir.Value)
		}
		if cfg := env(c, "SLUICE_CONFIG"); cfg != nil {
			m, ok := mounts[cfg.Value]
			if !ok || volumes[m.Name] == nil || volumes[m.Name].ConfigMap == nil {
				fail(cn, "SLUICE_CONFIG %s is not a ConfigMap mount", cfg.Value)
			} else if m.SubPath != "" {
				fail(cn, "the policy is mounted with subPath, which is never updated")
			}
		}

		// Probes.
		for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
			switch {
			case p == nil:
				fail(cn, "no %s probe", name)
			case p.HTTPGet != nil:
				if p.HTTPGet.Port.Type != intstr.String || ports[p.HTTPGet.Port.StrVal] == 0 {
					fail(cn, "%s probe port %s is not a named container port", name, p.HTTPGet.Port.String())
				}
				if !strings.HasPrefix(p.HTTPGet.Path, "/") {
					fail(cn, "%s probe path %q", name, p.HTTPGet.Path)
				}
			case p.Exec != nil:
				cmd := p.Exec.Command
				if len(cmd) < 2 || cmd[0] != "/sluice" || cmd[1] != "health" {
					fail(cn, "%s probe runs %q, not /sluice health", name, cmd)
				}
				for _, a := range cmd {
					if f, ok := strings.CutPrefix(a, "--url=https://127.0.0.1:"); ok {
						port, _, _ := strings.Cut(f, "/")
						if fmt.Sprint(ports["http"]) != port {
							fail(cn, "%s probe asks port %s, not the http port %d", name, port, ports["http"])
						}
					}
					for _, flag := range []string{"--cert-file=", "--key-file="} {
						if f, ok := strings.CutPrefix(a, flag); ok && !underMount(mounts, f) {
							fail(cn, "%s probe's %s is not under a mount", name, a)
						}
					}
				}
			default:
				fail(cn, "%s probe is neither httpGet nor exec", name)
			}
		}

		// Security.
		sc := c.SecurityContext
		switch {
		case sc == nil:
			fail(cn, "no securityContext")
		default:
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				fail(cn, "the root file system is writable")
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				fail(cn, "privilege escalation allowed")
			}
			if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
				fail(cn, "capabilities not all dropped")
			}
			if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
				fail(cn, "runs as root")
			}
		}

		// Resources: each request at most its limit.
		for res, req := range c.Resources.Requests {
			if lim, ok := c.Resources.Limits[res]; ok && req.Cmp(lim) > 0 {
				fail(cn, "requests %s %s over its limit %s", res, req.String(), lim.String())
			}
		}
	}
	c := &pod.Spec.Containers[0]
	containerPorts := map[string]bool{}
	for _, p := range c.Ports {
		containerPorts[p.Name] = true
	}

	// Services: select the pods; target named container ports.
	services := r.services()
	for _, s := range services {
		sn := "Service/" + s.Name
		if len(s.Spec.Selector) == 0 || !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) {
			fail(sn, "selector %v does not select the pods %v", s.Spec.Selector, pod.Labels)
		}
		names := map[string]bool{}
		for _, p := range s.Spec.Ports {
			if names[p.Name] {
				fail(sn, "port name %s twice", p.Name)
			}
			names[p.Name] = true
			if p.TargetPort.Type != intstr.String || !containerPorts[p.TargetPort.StrVal] {
				fail(sn, "port %s targets %s, not a named container port", p.Name, p.TargetPort.String())
			}
		}
	}

	for _, o := range r.all("PodDisruptionBudget") {
		p := o.obj.(*policyv1.PodDisruptionBudget)
		if (p.Spec.MinAvailable == nil) == (p.Spec.MaxUnavailable == nil) {
			fail(o.name(), "wants exactly one of minAvailable and maxUnavailable")
		}
		if sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector); err != nil || sel.Empty() || !sel.Matches(podLabels) {
			fail(o.name(), "selector %v does not select the pods", p.Spec.Selector)
		}
	}

	// The ServiceMonitor selects one Service (each pod scraped once) on a port it has.
	for _, o := range r.all("ServiceMonitor") {
		sm := o.obj.(*monitoringv1.ServiceMonitor)
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil || sel.Empty() {
			fail(o.name(), "selector %v: %v", sm.Spec.Selector, err)
			continue
		}
		var picked []*corev1.Service
		for _, s := range services {
			if sel.Matches(labels.Set(s.Labels)) {
				picked = append(picked, s)
			}
		}
		if len(picked) != 1 {
			fail(o.name(), "selects %d Services, want 1 (or pods are scraped more than once)", len(picked))
			continue
		}
		if !sm.Spec.NamespaceSelector.Any && !slices.Contains(sm.Spec.NamespaceSelector.MatchNames, namespace) {
			fail(o.name(), "namespaceSelector %v misses %s", sm.Spec.NamespaceSelector, namespace)
		}
		if len(sm.Spec.Endpoints) == 0 {
			fail(o.name(), "no endpoint")
		}
		for _, ep := range sm.Spec.Endpoints {
			if !slices.ContainsFunc(picked[0].Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
				fail(o.name(), "endpoint port %q is not a port of Service %s", ep.Port, picked[0].Name)
			}
			if ep.Path != "/metrics" {
				fail(o.name(), "endpoint path %q, want /metrics", ep.Path)
			}
			if s := ep.Scheme; s != nil && !slices.Contains([]string{"http", "https", "HTTP", "HTTPS"}, string(*s)) {
				fail(o.name(), "endpoint scheme %q", *s)
			}
		}
	}

	// The policy in the ConfigMap the pods read is one Sluice loads.
	if v := volumes["policy"]; v != nil && v.ConfigMap != nil {
		if cm := r.configMap(v.ConfigMap.Name); cm != nil {
			files := map[string][]byte{}
			for name, content := range cm.Data {
				files[name] = []byte(content)
			}
			if _, err := policy.LoadFiles(files); err != nil {
				fail("ConfigMap/"+cm.Name, "the policy does not load: %v", err)
			}
		}
	}
	return errs
}

// underMount tells whether file lies in one of the mounted folders.
func underMount(mounts map[string]corev1.VolumeMount, file string) bool {
	for dir := range mounts {
		if strings.HasPrefix(file, strings.TrimSuffix(dir, "/")+"/") {
			return true
		}
	}
	return false
}
