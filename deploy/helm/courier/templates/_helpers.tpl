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
