{{/* The release's name prefix: <release>-mandate, or <release> when it already says mandate. */}}
{{- define "mandate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "mandate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mandate
{{- end -}}

{{/* Selector labels of one service's pods; call with (dict "root" $ "name" "executor"). */}}
{{- define "mandate.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .name }}
{{- end -}}

{{- define "mandate.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The gRPC target through which the other services dial one: dns:///<svc>-headless:<port>, every ready pod round robin (values.yaml, grpc), or host:port of its ClusterIP Service with grpc.clientSideBalancing off. */}}
{{- define "mandate.grpcAddr" -}}
{{- $svc := index .root.Values.services .name -}}
{{- if .root.Values.grpc.clientSideBalancing -}}
dns:///{{ include "mandate.fullname" .root }}-{{ .name }}-headless:{{ $svc.grpcPort }}
{{- else -}}
{{ include "mandate.fullname" .root }}-{{ .name }}:{{ $svc.grpcPort }}
{{- end -}}
{{- end -}}

{{/* The public base URL the Ingress serves, "" without one. */}}
{{- define "mandate.publicURL" -}}
{{- if and .Values.ingress.enabled .Values.ingress.host -}}
{{ ternary "https" "http" (ne .Values.ingress.tlsSecretName "") }}://{{ .Values.ingress.host }}
{{- end -}}
{{- end -}}

{{/* An env entry read from the release's Secret, or from secrets.<override> when set. */}}
{{- define "mandate.secretEnv" -}}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      {{- if .override }}
      name: {{ .override.name }}
      key: {{ .override.key }}
      {{- else }}
      name: {{ required "secrets.existingSecret is required: the Secret holding the database URL and the service secret" .root.Values.secrets.existingSecret }}
      key: {{ .key }}
      {{- end }}
{{- end -}}

{{/* The environment every service shares: listen addresses, connection lifetime, tokens, logs, metrics, OpenTelemetry. */}}
{{- define "mandate.commonEnv" -}}
{{- $v := .root.Values -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: MANDATE_GRPC_ADDR
  value: "0.0.0.0:{{ .svc.grpcPort }}"
- name: MANDATE_HTTP_ADDR
  value: "0.0.0.0:{{ .svc.httpPort }}"
- name: MANDATE_LOG_LEVEL
  value: {{ $v.logLevel | quote }}
- name: MANDATE_METRICS
  value: {{ $v.metrics.enabled | quote }}
{{- with $v.grpc.maxConnectionAge }}
- name: MANDATE_GRPC_MAX_CONNECTION_AGE
  value: {{ . | quote }}
{{- end }}
{{- with $v.grpc.maxConnectionAgeGrace }}
- name: MANDATE_GRPC_MAX_CONNECTION_AGE_GRACE
  value: {{ . | quote }}
{{- end }}
{{ include "mandate.secretEnv" (dict "root" .root "env" "MANDATE_SERVICE_SECRET" "key" (required "secrets.serviceSecretKey is required" $v.secrets.serviceSecretKey)) }}
{{- if $v.secrets.devSecretKey }}
{{ include "mandate.secretEnv" (dict "root" .root "env" "MANDATE_DEV_SECRET" "key" $v.secrets.devSecretKey) }}
{{- end }}
{{- with $v.identity.issuers }}
- name: MANDATE_ISSUER
  value: {{ join "," . | quote }}
{{- end }}
{{- with $v.identity.audience }}
- name: MANDATE_AUDIENCE
  value: {{ join "," . | quote }}
{{- end }}
{{- with $v.identity.oidcIssuer }}
- name: MANDATE_OIDC_ISSUER
  value: {{ . | quote }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: "k8s.namespace.name=$(POD_NAMESPACE),k8s.pod.name=$(POD_NAME)"
{{- with $v.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $v.otel.protocol | quote }}
{{- end }}
{{- range $k, $val := $v.otel.env }}
- name: {{ $k }}
  value: {{ $val | quote }}
{{- end }}
{{- end -}}
