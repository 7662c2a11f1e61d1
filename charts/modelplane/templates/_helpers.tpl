{{/* Names: <release>-modelplane unless the release already says modelplane; 63 characters at most. */}}
{{- define "modelplane.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "modelplane.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "modelplane.operator.fullname" -}}
{{- printf "%s-operator" (include "modelplane.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "modelplane.gateway.fullname" -}}
{{- printf "%s-gateway" (include "modelplane.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object; version-dependent ones never go into selectors. */}}
{{- define "modelplane.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "modelplane.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: modelplane
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: stable across upgrades. Call with (dict "root" $ "component" "x"). */}}
{{- define "modelplane.selectorLabels" -}}
app.kubernetes.io/name: {{ include "modelplane.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "modelplane.componentLabels" -}}
{{ include "modelplane.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "modelplane.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "modelplane.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "modelplane.gateway.serviceAccountName" -}}
{{- if .Values.gateway.serviceAccount.create }}
{{- default (include "modelplane.gateway.fullname" .) .Values.gateway.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.gateway.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, the tag defaulting to the chart's appVersion. Call with (dict "image" x "root" $). */}}
{{- define "modelplane.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}

{{- define "modelplane.peering" -}}
{{- gt (int .Values.operator.replicaCount) 1 }}
{{- end }}

{{/* Namespaces the gateway routes to: its own list, else the operator's. */}}
{{- define "modelplane.gateway.namespaces" -}}
{{- join "," (default .Values.operator.watchNamespaces .Values.gateway.watchNamespaces) }}
{{- end }}

{{- define "modelplane.apiKeysSecret" -}}
{{- if .Values.gateway.apiKeys.existingSecret }}
{{- .Values.gateway.apiKeys.existingSecret }}
{{- else if .Values.gateway.apiKeys.entries }}
{{- printf "%s-api-keys" (include "modelplane.gateway.fullname" .) }}
{{- end }}
{{- end }}
