{{/*
courier as a native sidecar of a pod template (Kubernetes 1.29 or later): an
init container with restartPolicy Always starts before the app's containers,
is restarted if it exits, and is stopped after them. In a Deployment's pod
spec:

  terminationGracePeriodSeconds: {{ include "courier.terminationGracePeriodSeconds" . }}
  initContainers:
    {{- include "courier.sidecar" . | nindent 4 }}
  volumes:
    {{- include "courier.volumes" . | nindent 4 }}

and, in the pod template's metadata, {{- include "courier.podAnnotations" . | nindent 8 }}
under annotations for a Prometheus that scrapes by annotation.
*/}}

{{/* courier.secretFiles: the Secrets mounted as files, as a list of mounts (name, Secret, dir, items, variables). */}}
{{- define "courier.secretFiles" -}}
{{- $s := .Subcharts.courier.Values.secrets -}}
{{- $out := list -}}
{{- with $s.natsCreds -}}{{- if .secretName -}}
{{- $out = append $out (dict "volume" "courier-nats-creds" "secretName" .secretName "dir" "/etc/courier/nats" "items" (list (dict "key" .key "path" "user.creds" "env" "NATS_CREDS"))) -}}
{{- end -}}{{- end -}}
{{- with $s.natsNKey -}}{{- if .secretName -}}
{{- $out = append $out (dict "volume" "courier-nats-nkey" "secretName" .secretName "dir" "/etc/courier/nats-nkey" "items" (list (dict "key" .key "path" "user.nk" "env" "NATS_NKEY"))) -}}
{{- end -}}{{- end -}}
{{- with $s.natsTLS -}}{{- if .secretName -}}
{{- $items := list -}}
{{- if .caKey -}}{{- $items = append $items (dict "key" .caKey "path" "ca.crt" "env" "NATS_CA") -}}{{- end -}}
{{- if .certKey -}}{{- $items = append $items (dict "key" .certKey "path" "tls.crt" "env" "NATS_CERT") -}}{{- end -}}
{{- if .keyKey -}}{{- $items = append $items (dict "key" .keyKey "path" "tls.key" "env" "NATS_KEY") -}}{{- end -}}
{{- $out = append $out (dict "volume" "courier-nats-tls" "secretName" .secretName "dir" "/etc/courier/nats-tls" "items" $items) -}}
{{- end -}}{{- end -}}
{{- with $s.signingSecrets -}}{{- if .secretName -}}
{{- $out = append $out (dict "volume" "courier-signing" "secretName" .secretName "dir" "/etc/courier/signing" "items" (list (dict "key" .key "path" "secrets" "env" "COURIER_SIGNING_SECRETS_FILE"))) -}}
{{- end -}}{{- end -}}
{{- with $s.appToken -}}{{- if .secretName -}}
{{- $out = append $out (dict "volume" "courier-app-token" "secretName" .secretName "dir" "/etc/courier/app-token" "items" (list (dict "key" .key "path" "token" "env" "COURIER_APP_TOKEN_FILE"))) -}}
{{- end -}}{{- end -}}
{{- toJson (dict "mounts" $out) -}}
{{- end -}}

{{/* courier.sidecar: courier's container, a list item for the pod spec's initContainers. */}}
{{- define "courier.sidecar" -}}
{{- include "courier.scope" . -}}
{{- include "courier.checkValues" . -}}
{{- $v := .Subcharts.courier.Values -}}
{{- $mounts := (include "courier.secretFiles" . | fromJson).mounts -}}
- name: courier
  image: {{ include "courier.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  restartPolicy: Always
  env:
    # Derived from the chart's settings (adminPort, shutdownGraceSeconds,
    # dedup, secrets), so the probes, the grace period and the mounts agree.
    - name: COURIER_ADMIN_ADDR
      value: ":{{ $v.adminPort }}"
    - name: COURIER_SHUTDOWN_GRACE
      value: "{{ $v.shutdownGraceSeconds }}s"
    # Below the emptyDir (0777 and root's), so that courier creates the
    # store's directory itself, private to its user.
    - name: COURIER_DEDUP_DIR
      value: {{ printf "%s/dedup" (trimSuffix "/" $v.dedup.mountPath) | quote }}
    {{- range $mounts }}
    {{- $dir := .dir }}
    {{- range .items }}
    - name: {{ .env }}
      value: "{{ $dir }}/{{ .path }}"
    {{- end }}
    {{- end }}
    {{- if and $v.goMemLimit $v.resources $v.resources.limits $v.resources.limits.memory }}
    - name: GOMEMLIMIT
      valueFrom:
        resourceFieldRef:
          resource: limits.memory
    {{- end }}
    {{- range $k, $val := $v.env }}
    - name: {{ $k }}
      value: {{ include "courier.envValue" $val }}
    {{- end }}
    {{- with $v.subscriptions }}
    # subscriptions: one durable consumer each, their own variables as
    # COURIER_SUB_<NAME>_<VAR> (the name upper-cased, as courier reads it).
    - name: COURIER_SUBSCRIPTIONS
      value: {{ include "courier.subscriptionNames" $v | quote }}
    {{- range . }}
    {{- $prefix := printf "COURIER_SUB_%s_" (upper .name) }}
    {{- range $k, $val := .env }}
    - name: {{ $prefix }}{{ trimPrefix "COURIER_" $k }}
      value: {{ include "courier.envValue" $val }}
    {{- end }}
    {{- end }}
    {{- end }}
    {{- with $v.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    # Not "admin", which an app may well use itself.
    - name: courier-admin
      containerPort: {{ $v.adminPort }}
      protocol: TCP
  # The app starts once courier's admin server answers. Not /readyz: courier
  # is ready only once the app's health URL passes, and the app would never
  # be started.
  startupProbe:
    httpGet:
      path: /healthz
      port: courier-admin
    {{- toYaml $v.startupProbe | nindent 4 }}
  # /healthz does not depend on NATS or the app: an outage of either never
  # restarts courier.
  livenessProbe:
    httpGet:
      path: /healthz
      port: courier-admin
    {{- toYaml $v.livenessProbe | nindent 4 }}
  # No readiness probe on /readyz, on purpose: in a native sidecar courier's
  # readiness decides the whole pod's, so a NATS outage or an app outage
  # (which /readyz reports) would take the app out of its Service too. Alert
  # on the metrics instead (the PrometheusRule).
  {{- with $v.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- $sc := dict "runAsNonRoot" true "runAsUser" 65532 "runAsGroup" 65532 "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "capabilities" (dict "drop" (list "ALL")) "seccompProfile" (dict "type" "RuntimeDefault") }}
    {{- toYaml (mergeOverwrite $sc $v.securityContext) | nindent 4 }}
  volumeMounts:
    - name: courier-data
      mountPath: {{ $v.dedup.mountPath | quote }}
    {{- range $mounts }}
    - name: {{ .volume }}
      mountPath: {{ .dir }}
      readOnly: true
    {{- end }}
{{- end -}}

{{/* courier.volumes: the volumes courier.sidecar mounts, list items for the pod spec's volumes. */}}
{{- define "courier.volumes" -}}
{{- include "courier.scope" . -}}
{{- $v := .Subcharts.courier.Values -}}
{{- $mounts := (include "courier.secretFiles" . | fromJson).mounts -}}
# COURIER_DEDUP_DIR: private to the pod. With COURIER_DEDUP_STORE=shared
# losing it loses nothing (the keys are in the bucket).
- name: courier-data
  emptyDir:
    sizeLimit: {{ $v.dedup.sizeLimit }}
{{- range $mounts }}
- name: {{ .volume }}
  secret:
    # The default mode (0644): the files are root's, and courier runs as
    # 65532. Only courier's container mounts them.
    secretName: {{ .secretName }}
    items:
      {{- range .items }}
      - key: {{ .key }}
        path: {{ .path }}
      {{- end }}
{{- end }}
{{- end -}}

{{/*
courier.terminationGracePeriodSeconds: on deletion the kubelet stops the app's
containers first, then courier, all within this: the app's appStopSeconds,
courier's COURIER_SHUTDOWN_GRACE for requests still in flight, and 5 seconds
to NAK the rest, close the store and drain the connection. Past it the kubelet
kills courier: nothing is lost (its messages are redelivered after
COURIER_ACK_WAIT) but the local store may not be closed cleanly.
*/}}
{{- define "courier.terminationGracePeriodSeconds" -}}
{{- include "courier.scope" . -}}
{{- $v := .Subcharts.courier.Values -}}
{{- add $v.appStopSeconds $v.shutdownGraceSeconds 5 -}}
{{- end -}}

{{/* courier.podAnnotations: prometheus.io/* for a Prometheus that scrapes by annotation; empty with scrapeAnnotations false. */}}
{{- define "courier.podAnnotations" -}}
{{- include "courier.scope" . -}}
{{- $v := .Subcharts.courier.Values -}}
{{- if $v.scrapeAnnotations -}}
prometheus.io/scrape: "true"
prometheus.io/port: "{{ $v.adminPort }}"
prometheus.io/path: /metrics
{{- end -}}
{{- end -}}
