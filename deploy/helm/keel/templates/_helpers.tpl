{{- define "keel.name" -}}{{ .Release.Name }}{{- end -}}

{{- define "keel.labels" -}}
app.kubernetes.io/name: keel
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "keel.scheme" -}}{{ if .Values.tls.enabled }}https{{ else }}http{{ end }}{{- end -}}

{{/* The members' peer URLs under the headless Service: stable pod DNS names. */}}
{{- define "keel.initialCluster" -}}
{{- $name := include "keel.name" . -}}
{{- $ns := .Release.Namespace -}}
{{- $domain := .Values.clusterDomain -}}
{{- $port := .Values.ports.peer -}}
{{- range $i := until (int .Values.replicas) -}}
{{- if $i }},{{ end -}}
{{ $name }}-{{ $i }}=http://{{ $name }}-{{ $i }}.{{ $name }}.{{ $ns }}.svc.{{ $domain }}:{{ $port }}
{{- end -}}
{{- end -}}

{{/* One word for /bin/sh: single quotes, each ' inside closed, escaped and reopened. `quote`
would give double quotes, inside which the shell still expands $ and backticks. */}}
{{- define "keel.shellQuote" -}}
'{{ . | toString | replace "'" "'\\''" }}'
{{- end -}}
