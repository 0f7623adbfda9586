{{/*
The objects that go with courier beside a Deployment, each off by default
(values podMonitor, prometheusRule, dashboard, keda, networkPolicy). In a
template of the app's chart:

  {{ include "courier.objects" (dict "top" $ "name" (include "app.fullname" .) "selectorLabels" (include "app.selectorLabels" . | fromYaml)) }}

name is the Deployment's (the objects are named <name>-courier), and
selectorLabels its pods' labels (the PodMonitor and the NetworkPolicy select
the pods by them). Each part can be included alone with the same dict.
*/}}

{{- define "courier.objects" -}}
{{- include "courier.checkArgs" . -}}
{{- include "courier.checkValues" .top -}}
{{- $v := .top.Subcharts.courier.Values -}}
{{- if $v.podMonitor.enabled }}
---
{{ include "courier.podMonitor" . }}
{{- end }}
{{- if $v.prometheusRule.enabled }}
---
{{ include "courier.prometheusRule" . }}
{{- end }}
{{- if $v.dashboard.enabled }}
---
{{ include "courier.dashboard" . }}
{{- end }}
{{- if $v.keda.enabled }}
---
{{ include "courier.scaledObject" . }}
{{- end }}
{{- if $v.networkPolicy.enabled }}
---
{{ include "courier.networkPolicy" . }}
{{- end }}
{{- end -}}

{{/* courier.podMonitor: the Prometheus Operator ignores prometheus.io/* annotations; this scrapes courier's admin port in every pod of the Deployment. */}}
{{- define "courier.podMonitor" -}}
{{- include "courier.checkArgs" . -}}
{{- $v := .top.Subcharts.courier.Values -}}
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata:
  name: {{ .name }}-courier
  labels:
    {{- include "courier.labels" . | nindent 4 }}
    {{- with $v.podMonitor.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- toYaml .selectorLabels | nindent 6 }}
  podMetricsEndpoints:
    - port: courier-admin
      path: /metrics
      interval: {{ $v.podMonitor.interval }}
{{- end -}}

{{/* courier.prometheusRule: deploy/prometheus/courier-rules.yaml's groups (files/courier-rules.yaml, a copy kept equal by deploy/kubernetes/helm_test.go). */}}
{{- define "courier.prometheusRule" -}}
{{- include "courier.checkArgs" . -}}
{{- $c := .top.Subcharts.courier -}}
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: {{ .name }}-courier
  labels:
    {{- include "courier.labels" . | nindent 4 }}
    {{- with $c.Values.prometheusRule.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- /* Blank lines of the file stay blank, not two spaces. */}}
spec:
  {{- regexReplaceAll "(?m)^ +$" ($c.Files.Get "files/courier-rules.yaml" | nindent 2) "" }}
{{- end -}}

{{/* courier.dashboard: deploy/grafana/courier.json (files/courier.json, a copy kept equal by the tests) for Grafana's dashboard sidecar. */}}
{{- define "courier.dashboard" -}}
{{- include "courier.checkArgs" . -}}
{{- $c := .top.Subcharts.courier -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .name }}-courier-dashboard
  labels:
    {{- include "courier.labels" . | nindent 4 }}
    {{- with $c.Values.dashboard.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $c.Values.dashboard.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
data:
  courier.json: |-
    {{- $c.Files.Get "files/courier.json" | nindent 4 }}
{{- end -}}

{{/*
courier.scaledObject: KEDA's nats-jetstream scaler on the consumer courier
consumes (COURIER_STREAM, COURIER_CONSUMER), one trigger per subscription.
KEDA counts as lag the consumer's pending and ack pending messages, and ack
pending includes what courier holds without working on it (backoffs, an app
outage, its read-ahead): deploy/kubernetes/keda-scaledobject.yaml explains
the numbers.
*/}}
{{- define "courier.scaledObject" -}}
{{- include "courier.checkArgs" . -}}
{{- $v := .top.Subcharts.courier.Values -}}
{{- $k := $v.keda -}}
{{- if gt (int $k.minReplicaCount) (int $k.maxReplicaCount) -}}
{{- fail (printf "courier: keda.minReplicaCount %v is above keda.maxReplicaCount %v" $k.minReplicaCount $k.maxReplicaCount) -}}
{{- end -}}
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: {{ .name }}-courier
  labels:
    {{- include "courier.labels" . | nindent 4 }}
spec:
  scaleTargetRef:
    kind: Deployment
    name: {{ .name }}
  minReplicaCount: {{ $k.minReplicaCount }}
  maxReplicaCount: {{ $k.maxReplicaCount }}
  pollingInterval: {{ $k.pollingInterval }}
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        scaleDown:
          stabilizationWindowSeconds: {{ $k.scaleDownStabilizationSeconds }}
  {{- /* One trigger per durable consumer: the HPA follows the busiest. */}}
  triggers:
    {{- range $v.subscriptions | default (list (dict "name" "")) }}
    {{- $e := .env | default dict }}
    {{- $stream := $e.COURIER_STREAM | default $v.env.COURIER_STREAM }}
    {{- if not $stream }}
    {{- if .name }}
    {{- fail (printf "courier: subscription %s has no COURIER_STREAM, which keda.enabled needs: set it in its env or in env" .name) }}
    {{- end }}
    {{- fail "courier: env.COURIER_STREAM is required with keda.enabled" }}
    {{- end }}
    - type: nats-jetstream
      metadata:
        natsServerMonitoringEndpoint: {{ required "courier: keda.natsServerMonitoringEndpoint (host:port of the NATS monitoring port) is required with keda.enabled" $k.natsServerMonitoringEndpoint | quote }}
        account: {{ $k.account | quote }}
        stream: {{ $stream | toString | quote }}
        consumer: {{ $e.COURIER_CONSUMER | default $v.env.COURIER_CONSUMER | default "courier" | toString | quote }}
        lagThreshold: {{ include "courier.envValue" $k.lagThreshold }}
        activationLagThreshold: {{ include "courier.envValue" $k.activationLagThreshold }}
    {{- end }}
{{- end -}}

{{/*
courier.networkPolicy: allows what courier itself needs: NATS on the ports of
NATS_URL, DNS, and scrapes of the admin port (the kubelet's probes come from
the node, which NetworkPolicies do not restrict in the common CNIs). It
selects the whole pod: the app's own traffic needs a policy of its own, or
extraIngress / extraEgress.
*/}}
{{- define "courier.networkPolicy" -}}
{{- include "courier.checkArgs" . -}}
{{- $v := .top.Subcharts.courier.Values -}}
{{- $n := $v.networkPolicy -}}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ .name }}-courier
  labels:
    {{- include "courier.labels" . | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- toYaml .selectorLabels | nindent 6 }}
  policyTypes:
    - Ingress
    - Egress
  ingress:
    - ports:
        - port: {{ $v.adminPort }}
          protocol: TCP
      {{- with $n.metricsFrom }}
      from:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    {{- with $n.extraIngress }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  egress:
    - ports:
        {{- range splitList "," (include "courier.natsPorts" $v) }}
        - port: {{ . }}
          protocol: TCP
        {{- end }}
      {{- with $n.natsTo }}
      to:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    - ports:
        - port: 53
          protocol: UDP
        - port: 53
          protocol: TCP
    {{- with $n.extraEgress }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}
