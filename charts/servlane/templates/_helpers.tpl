{{/* Names: <release>-servlane unless the release already says servlane; 63 characters at most. */}}
{{- define "servlane.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "servlane.fullname" -}}
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

{{/* <fullname><suffix> in 63 characters, the suffix always whole: cutting the joined name cut the suffix (a long
release made the operator's and the gateway's objects one name) or left it past 63 (the metrics Service).
Call with (dict "root" $ "suffix" "-gateway"). */}}
{{- define "servlane.suffixed" -}}
{{- $base := include "servlane.fullname" .root | trunc (int (sub 63 (len .suffix))) | trimSuffix "-" }}
{{- printf "%s%s" $base .suffix }}
{{- end }}

{{- define "servlane.operator.fullname" -}}
{{- include "servlane.suffixed" (dict "root" . "suffix" "-operator") }}
{{- end }}

{{- define "servlane.gateway.fullname" -}}
{{- include "servlane.suffixed" (dict "root" . "suffix" "-gateway") }}
{{- end }}

{{/* The gateway's metrics Service, which is also the Prometheus job the canaries read by default. */}}
{{- define "servlane.gateway.metricsName" -}}
{{- include "servlane.suffixed" (dict "root" . "suffix" "-gateway-metrics") }}
{{- end }}

{{/* Labels on every object; version-dependent ones never go into selectors. */}}
{{- define "servlane.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "servlane.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: servlane
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: stable across upgrades. Call with (dict "root" $ "component" "x"). */}}
{{- define "servlane.selectorLabels" -}}
app.kubernetes.io/name: {{ include "servlane.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "servlane.componentLabels" -}}
{{ include "servlane.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "servlane.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "servlane.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "servlane.gateway.serviceAccountName" -}}
{{- if .Values.gateway.serviceAccount.create }}
{{- default (include "servlane.gateway.fullname" .) .Values.gateway.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.gateway.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, the tag defaulting to the chart's appVersion. Call with (dict "image" x "root" $). */}}
{{- define "servlane.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* A runtime image, repository:tag, the tag defaulting to <appVersion>-<variant> (cuda or cpu).
Call with (dict "image" x "variant" "cuda" "root" $). */}}
{{- define "servlane.runtimeImage" -}}
{{- printf "%s:%s" .image.repository (default (printf "%s-%s" .root.Chart.AppVersion .variant) .image.tag) }}
{{- end }}

{{- define "servlane.peering" -}}
{{- gt (int .Values.operator.replicaCount) 1 }}
{{- end }}

{{/* Namespaces the gateway routes to: its own list, else the operator's. */}}
{{- define "servlane.gateway.namespaces" -}}
{{- join "," (default .Values.operator.watchNamespaces .Values.gateway.watchNamespaces) }}
{{- end }}

{{- /* Where plain model names resolve: explicit, else the watched namespaces, else the release namespace
(never every namespace: an object in some other namespace must not take over a name clients call). */}}
{{- define "servlane.gateway.servingNamespaces" -}}
{{- $watched := include "servlane.gateway.namespaces" . }}
{{- if .Values.gateway.servingNamespaces }}
{{- join "," .Values.gateway.servingNamespaces }}
{{- else if $watched }}
{{- $watched }}
{{- else }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{/* "true" when the gateway's rate limits are shared through Redis (gateway.rateLimits.redis). */}}
{{- define "servlane.gateway.sharedLimits" -}}
{{- $redis := .Values.gateway.rateLimits.redis }}
{{- if or $redis.url $redis.existingSecret }}true{{ end }}
{{- end }}

{{/* "true" when any gateway rate limit is set: they then need Redis to hold across replicas. */}}
{{- define "servlane.gateway.anyRateLimit" -}}
{{- $r := .Values.gateway.rateLimits }}
{{- if or (gt (float64 $r.keyRequestsPerMinute) 0.0) (gt (float64 $r.keyTokensPerMinute) 0.0) (gt (int64 $r.keyMaxInFlight) 0) (gt (float64 $r.featureRequestsPerMinute) 0.0) (gt (float64 $r.featureTokensPerMinute) 0.0) }}true{{ end }}
{{- end }}

{{- define "servlane.apiKeysSecret" -}}
{{- if .Values.gateway.apiKeys.existingSecret }}
{{- .Values.gateway.apiKeys.existingSecret }}
{{- else if .Values.gateway.apiKeys.entries }}
{{- printf "%s-api-keys" (include "servlane.gateway.fullname" .) }}
{{- end }}
{{- end }}

{{/*
OpenTelemetry's own variables for a process that traces (the gateway); the operator passes the same to model pods.
*/}}
{{- define "servlane.tracingEnv" -}}
{{- if .Values.tracing.enabled }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ required "tracing.otlpEndpoint is required when tracing.enabled" .Values.tracing.otlpEndpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: "http/protobuf"
- name: OTEL_TRACES_SAMPLER
  value: "parentbased_traceidratio"
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .Values.tracing.samplingRatio | quote }}
{{- end }}
{{- end }}
