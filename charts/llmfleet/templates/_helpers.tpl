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
