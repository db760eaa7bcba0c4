{{/* The chart's name, or nameOverride. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' name: fullnameOverride, else the release name, followed by the chart's name
unless the release name holds it already. 63 characters at most (a DNS label), less room for
the suffixes some objects add ("-headless", "-policy").
*/}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 54 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" . }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ (.Values.image.tag | default .Chart.AppVersion) | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the pods: never change them in an upgrade (selectors are immutable). */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret the pods read: existingSecret, or the chart's. */}}
{{- define "sluice.secretName" -}}
{{- default (include "sluice.fullname" .) .Values.existingSecret }}
{{- end }}

{{/* The ConfigMap of the policy, or "" when the built-in policy is used. */}}
{{- define "sluice.policyConfigMap" -}}
{{- if .Values.policy.existingConfigMap }}
{{- .Values.policy.existingConfigMap }}
{{- else if (get .Values.policy "files") }}
{{- printf "%s-policy" (include "sluice.fullname" .) }}
{{- end }}
{{- end }}

{{- define "sluice.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* mTLS: the probes run `sluice health` in the container, as kubelet probes carry no client certificate. */}}
{{- define "sluice.execProbes" -}}
{{- and .Values.tls.enabled .Values.tls.requireClientCert }}
{{- end }}

{{/*
One probe: an HTTP GET by the kubelet, or under mTLS `sluice health` with the pod's own
certificate. --insecure: the probe asks its own pod on loopback, where the certificate's name
(the Service's) cannot match; nothing else listens there.
*/}}
{{- define "sluice.probe" -}}
{{- $root := index . 0 }}
{{- $p := index . 1 }}
{{- if eq (include "sluice.execProbes" $root) "true" }}
exec:
  command:
    - /sluice
    - health
    - --url=https://127.0.0.1:8080{{ $p.path }}
    - --insecure
    - --cert-file=/etc/sluice/tls/tls.crt
    - --key-file=/etc/sluice/tls/tls.key
    - --timeout={{ $p.timeoutSeconds }}s
{{- else }}
httpGet:
  path: {{ $p.path }}
  port: http
  scheme: {{ ternary "HTTPS" "HTTP" $root.Values.tls.enabled }}
{{- end }}
initialDelaySeconds: {{ $p.initialDelaySeconds }}
periodSeconds: {{ $p.periodSeconds }}
timeoutSeconds: {{ $p.timeoutSeconds }}
failureThreshold: {{ $p.failureThreshold }}
{{- end }}
