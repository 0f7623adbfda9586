{{/*
Helpers of courier's templates. Every template takes the including chart's
root context (or a dict holding it as "top") and finds this chart's values,
version and files as .Subcharts.courier: in a library chart's template .Values,
.Chart and .Files are the including chart's.
*/}}

{{/* courier.scope: fails clearly unless this chart is a dependency named courier. */}}
{{- define "courier.scope" -}}
{{- if not (and .Subcharts (hasKey .Subcharts "courier")) -}}
{{- fail "courier: add the courier chart as a dependency named courier (no alias) and run helm dependency update" -}}
{{- end -}}
{{- end -}}

{{/* courier.image: repository@digest, else repository:tag (tag defaulting to the chart's appVersion). */}}
{{- define "courier.image" -}}
{{- include "courier.scope" . -}}
{{- $c := .Subcharts.courier -}}
{{- $i := $c.Values.image -}}
{{- if $i.digest -}}
{{ $i.repository }}@{{ $i.digest }}
{{- else -}}
{{ $i.repository }}:{{ $i.tag | default $c.Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
courier.envValue: a value of env as the string courier reads. YAML numbers
reach a template as float64, which would print 1000000 as 1e+06: whole
numbers are printed as integers.
*/}}
{{- define "courier.envValue" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) -}}
{{ int64 . | toString | quote }}
{{- else -}}
{{ toString . | quote }}
{{- end -}}
{{- end -}}

{{/* courier.natsPorts: the ports of NATS_URL's servers, comma separated, each once. */}}
{{- define "courier.natsPorts" -}}
{{- $urls := .env.NATS_URL | default "nats://127.0.0.1:4222" | toString -}}
{{- $ports := list -}}
{{- range splitList "," $urls -}}
{{- $u := trim . -}}
{{- if $u -}}
{{- if not (contains "://" $u) -}}{{- $u = printf "nats://%s" $u -}}{{- end -}}
{{- $p := urlParse $u -}}
{{- $port := regexFind ":[0-9]+$" $p.host | trimPrefix ":" -}}
{{- if not $port -}}
{{- $port = get (dict "ws" "80" "wss" "443") $p.scheme | default "4222" -}}
{{- end -}}
{{- $ports = append $ports $port -}}
{{- end -}}
{{- end -}}
{{- $ports | uniq | join "," -}}
{{- end -}}

{{/* courier.labels: the labels of the objects courier.objects renders. */}}
{{- define "courier.labels" -}}
{{- range $k, $v := .selectorLabels -}}
{{ $k }}: {{ $v | quote }}
{{ end -}}
app.kubernetes.io/component: courier
app.kubernetes.io/managed-by: {{ .top.Release.Service }}
helm.sh/chart: courier-{{ .top.Subcharts.courier.Chart.Version }}
{{- end -}}

{{/* courier.checkArgs: what courier.objects and its parts are called with. */}}
{{- define "courier.checkArgs" -}}
{{- if not (and (kindIs "map" .) (hasKey . "top") .name .selectorLabels) -}}
{{- fail "courier: call courier.objects (and its parts) with (dict \"top\" $ \"name\" <the Deployment's name> \"selectorLabels\" <its pods' selector labels, a map>)" -}}
{{- end -}}
{{- include "courier.scope" .top -}}
{{- end -}}

{{/*
courier.checkValues: what values.schema.json cannot refuse with a reason a
person reads, or at all. The variables env must not set (the chart derives
them from other settings, or they are secrets), each with what to do
instead: the same words as their description in values.schema.json. And
several replicas of a Deployment with the embedded dedup store
(COURIER_DEDUP_STORE=badger, the default): each pod would recognise only
its own keys, so a duplicate reaching another pod would reach the app.
Replicas are the including chart's replicaCount, its autoscaling.maxReplicas
(helm create's names) when autoscaling.enabled, and keda.maxReplicaCount
when keda.enabled, whichever of them is set.
*/}}
{{- define "courier.checkValues" -}}
{{- include "courier.scope" . -}}
{{- $v := .Subcharts.courier.Values -}}
{{- $refused := dict
  "COURIER_ADMIN_ADDR" "Not here: set adminPort."
  "COURIER_APP_TOKEN_FILE" "Not here: set secrets.appToken."
  "COURIER_DEDUP_DIR" "Not here: set dedup.mountPath."
  "COURIER_SHUTDOWN_GRACE" "Not here: set shutdownGraceSeconds."
  "COURIER_SIGNING_SECRETS_FILE" "Not here: set secrets.signingSecrets."
  "GOMEMLIMIT" "Not here: set by goMemLimit from resources.limits.memory."
  "NATS_CA" "Not here: set secrets.natsTLS."
  "NATS_CERT" "Not here: set secrets.natsTLS."
  "NATS_CREDS" "Not here: set secrets.natsCreds."
  "NATS_KEY" "Not here: set secrets.natsTLS."
  "NATS_NKEY" "Not here: set secrets.natsNKey."
  "NATS_PASSWORD" "Not here: a secret: give it in extraEnv with valueFrom.secretKeyRef."
  "NATS_TOKEN" "Not here: a secret: give it in extraEnv with valueFrom.secretKeyRef."
  "OTEL_EXPORTER_OTLP_HEADERS" "Not here: a secret (an API key, as a rule): give it in extraEnv with valueFrom.secretKeyRef."
  "OTEL_EXPORTER_OTLP_TRACES_HEADERS" "Not here: a secret (an API key, as a rule): give it in extraEnv with valueFrom.secretKeyRef."
-}}
{{- range $name := keys $refused | sortAlpha -}}
{{- if hasKey $v.env $name -}}
{{- fail (printf "courier: env.%s is refused. %s" $name (get $refused $name)) -}}
{{- end -}}
{{- end -}}
{{- include "courier.checkSubscriptions" . -}}
{{- $store := $v.env.COURIER_DEDUP_STORE | default "badger" | toString | lower | trim -}}
{{- /* Dedup is on unless every subscription's COURIER_DEDUP_TTL is 0. */ -}}
{{- $plainTTL := $v.env.COURIER_DEDUP_TTL | default "24h" | toString -}}
{{- $ttls := list $plainTTL -}}
{{- with $v.subscriptions -}}
{{- $ttls = list -}}
{{- range . -}}
{{- $ttls = append $ttls ((.env | default dict).COURIER_DEDUP_TTL | default $plainTTL | toString) -}}
{{- end -}}
{{- end -}}
{{- $dedup := false -}}
{{- range $ttls -}}
{{- if not (regexMatch "^\\s*0+([a-zµμ]+)?\\s*$" .) -}}{{- $dedup = true -}}{{- end -}}
{{- end -}}
{{- if and (eq $store "badger") $dedup -}}
{{- $many := list -}}
{{- if gt (int (.Values.replicaCount | default 1)) 1 -}}
{{- $many = append $many (printf "replicaCount %v" .Values.replicaCount) -}}
{{- end -}}
{{- with .Values.autoscaling -}}
{{- if and .enabled (gt (int (.maxReplicas | default 1)) 1) -}}
{{- $many = append $many (printf "autoscaling.maxReplicas %v" .maxReplicas) -}}
{{- end -}}
{{- end -}}
{{- if and $v.keda.enabled (gt (int $v.keda.maxReplicaCount) 1) -}}
{{- $many = append $many (printf "courier.keda.maxReplicaCount %v" $v.keda.maxReplicaCount) -}}
{{- end -}}
{{- with $many -}}
{{- fail (printf "courier: %s with COURIER_DEDUP_STORE=badger (the default): each pod would recognise only its own keys, and a duplicate reaching another pod would reach the app; set courier.env.COURIER_DEDUP_STORE: shared (a key-value bucket every pod shares), or run one replica" (join " and " .)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* courier.subscriptionNames: COURIER_SUBSCRIPTIONS, from subscriptions[].name; takes courier's values. */}}
{{- define "courier.subscriptionNames" -}}
{{- $names := list -}}
{{- range .subscriptions -}}{{- $names = append $names .name -}}{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{/*
courier.checkSubscriptions: what values.schema.json cannot say of
subscriptions. Two names that differ only in case are one to courier (their
variables are upper case). env.COURIER_SUBSCRIPTIONS and env.COURIER_SUB_*
beside the list would say the same thing twice, and disagree. A plain
variable of env that every subscription sets for itself is never used (nor
checked by courier, which only warns of it): most likely left over from a
courier of one subscription, so a deploy meant to change it would change
nothing.
*/}}
{{- define "courier.checkSubscriptions" -}}
{{- $v := .Subcharts.courier.Values -}}
{{- with $v.subscriptions -}}
{{- $subs := . -}}
{{- range $name := keys $v.env | sortAlpha -}}
{{- if eq $name "COURIER_SUBSCRIPTIONS" -}}
{{- fail "courier: env.COURIER_SUBSCRIPTIONS is refused beside subscriptions: the chart sets it from subscriptions[].name" -}}
{{- end -}}
{{- if hasPrefix "COURIER_SUB_" $name -}}
{{- fail (printf "courier: env.%s is refused beside subscriptions: set the variable in its subscription's env, by its plain name (subscriptions[].env.COURIER_<VAR>)" $name) -}}
{{- end -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $subs -}}
{{- $key := upper .name -}}
{{- if hasKey $seen $key -}}
{{- fail (printf "courier: subscriptions %s and %s are one name to courier, whose variables are upper case (COURIER_SUB_%s_STREAM for both): name them apart" (get $seen $key) .name $key) -}}
{{- end -}}
{{- $_ := set $seen $key .name -}}
{{- end -}}
{{- range $name := keys $v.env | sortAlpha -}}
{{- $everyOne := true -}}
{{- range $subs -}}
{{- /* "" is unset to courier: the plain variable applies. */ -}}
{{- if not (get (.env | default dict) $name | toString) -}}{{- $everyOne = false -}}{{- end -}}
{{- end -}}
{{- if and $everyOne (get $v.env $name | toString) -}}
{{- fail (printf "courier: env.%s is set but every subscription sets its own (subscriptions[].env.%s): it would never be used; remove it from env, or from the subscriptions that are to use it" $name $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
