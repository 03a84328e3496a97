{{- define "llmfleet.labels" -}}
app.kubernetes.io/name: llmfleet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
{{- define "llmfleet.operatorName" -}}
{{ .Release.Name }}-operator
{{- end -}}
{{- define "llmfleet.endpointPickerName" -}}
{{ .Release.Name }}-endpoint-picker
{{- end -}}
{{- define "llmfleet.rankLauncherName" -}}
{{ .Release.Name }}-rank-launcher
{{- end -}}

{{/* Where the Prometheus credentials and CA are mounted in the operator pod. */}}
{{- define "llmfleet.prometheusSecretsDir" -}}
/etc/llmfleet/prometheus
{{- end }}

{{/* The volumes holding Prometheus credentials and CA; empty when none is set. Secrets are
mounted as volumes, not environment variables: the kubelet updates a rotated Secret in place and
the operator reads it on every query. */}}
{{- define "llmfleet.prometheusVolumes" -}}
{{- with .Values.prometheus }}
{{- if and (not .bearerToken.serviceAccountToken) .bearerToken.secret.name }}
- name: prometheus-bearer-token
  secret:
    secretName: {{ .bearerToken.secret.name }}
{{- end }}
{{- if .basicAuth.username }}
- name: prometheus-basic-auth
  secret:
    secretName: {{ required "prometheus.basicAuth.passwordSecret.name is required with prometheus.basicAuth.username" .basicAuth.passwordSecret.name }}
{{- end }}
{{- if .tls.ca.name }}
- name: prometheus-ca
  {{- if eq .tls.ca.kind "Secret" }}
  secret:
    secretName: {{ .tls.ca.name }}
  {{- else }}
  configMap:
    name: {{ .tls.ca.name }}
  {{- end }}
{{- end }}
{{- if .tls.clientCertSecret }}
- name: prometheus-client
  secret:
    secretName: {{ .tls.clientCertSecret }}
{{- end }}
{{- end }}
{{- end }}

{{- define "llmfleet.prometheusVolumeMounts" -}}
{{- $dir := include "llmfleet.prometheusSecretsDir" . }}
{{- with .Values.prometheus }}
{{- if and (not .bearerToken.serviceAccountToken) .bearerToken.secret.name }}
- name: prometheus-bearer-token
  mountPath: {{ $dir }}/bearer-token
  readOnly: true
{{- end }}
{{- if .basicAuth.username }}
- name: prometheus-basic-auth
  mountPath: {{ $dir }}/basic-auth
  readOnly: true
{{- end }}
{{- if .tls.ca.name }}
- name: prometheus-ca
  mountPath: {{ $dir }}/ca
  readOnly: true
{{- end }}
{{- if .tls.clientCertSecret }}
- name: prometheus-client
  mountPath: {{ $dir }}/client
  readOnly: true
{{- end }}
{{- end }}
{{- end }}
