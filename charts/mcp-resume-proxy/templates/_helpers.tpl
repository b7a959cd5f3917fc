{{/* Name of the chart, overridable. */}}
{{- define "mcp-resume-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release name, plus the chart name unless the release name contains it. */}}
{{- define "mcp-resume-proxy.fullname" -}}
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

{{/* Name of the headless Service that governs the pods and carries the admin port. */}}
{{- define "mcp-resume-proxy.adminServiceName" -}}
{{- printf "%s-admin" (include "mcp-resume-proxy.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "mcp-resume-proxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "mcp-resume-proxy.labels" -}}
helm.sh/chart: {{ include "mcp-resume-proxy.chart" . }}
{{ include "mcp-resume-proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select this release's pods. */}}
{{- define "mcp-resume-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mcp-resume-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "mcp-resume-proxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mcp-resume-proxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "mcp-resume-proxy.proxyImage" -}}
{{- printf "%s:%s" .Values.proxy.image.repository (default .Chart.AppVersion .Values.proxy.image.tag) }}
{{- end }}

{{/* Where the config file and the data volume are mounted in the proxy container. */}}
{{- define "mcp-resume-proxy.configDir" -}}/etc/mcp-resume-proxy{{- end }}
{{- define "mcp-resume-proxy.dataDir" -}}/data{{- end }}
{{/* Where the TLS Secrets (and the upstream CA) are mounted, one directory each. */}}
{{- define "mcp-resume-proxy.secretsDir" -}}/var/run/secrets/mcp-resume-proxy{{- end }}

{{/* Non-empty with proxy.config.log.backend = "redis". */}}
{{- define "mcp-resume-proxy.redis" -}}
{{- if eq (.Values.proxy.config.log.backend | default "local") "redis" }}true{{ end }}
{{- end }}

{{/* Non-empty when the internal listener is on (proxy.cluster.forwarding): cluster.listen, the
container port "cluster", env POD_IP, the NetworkPolicy rule for the chart's own pods. */}}
{{- define "mcp-resume-proxy.forwarding" -}}
{{- if .Values.proxy.cluster.forwarding }}true{{ end }}
{{- end }}

{{/* Name of the proxy's client port: https when it speaks TLS. */}}
{{- define "mcp-resume-proxy.clientPortName" -}}
{{- if .Values.tls.secretName }}https{{ else }}http{{ end }}
{{- end }}

{{/* Non-empty when an upstream CA bundle is mounted (tls.upstreamCa). */}}
{{- define "mcp-resume-proxy.upstreamCa" -}}
{{- with .Values.tls.upstreamCa }}{{ if or .secretName .configMapName }}true{{ end }}{{ end }}
{{- end }}

{{/* The upstream SSE URL: the MCP server container over the pod's loopback. */}}
{{- define "mcp-resume-proxy.upstreamUrl" -}}
{{- $u := .Values.proxy.config.upstream -}}
{{- if $u.sse_url -}}
{{- $u.sse_url -}}
{{- else -}}
{{- printf "http://127.0.0.1:%d%s" (int .Values.mcpServer.port) .Values.mcpServer.ssePath -}}
{{- end -}}
{{- end }}

{{/* Label matchers that select this release's proxy series in alert rules. */}}
{{- define "mcp-resume-proxy.ruleSelector" -}}
{{- if .Values.prometheusRule.selector -}}
{{- .Values.prometheusRule.selector -}}
{{- else -}}
{{- printf "namespace=%q,job=%q" .Release.Namespace (include "mcp-resume-proxy.fullname" .) -}}
{{- end -}}
{{- end }}

{{/*
Checks that values which would only fail at run time fail at render time instead.
*/}}
{{- define "mcp-resume-proxy.validate" -}}
{{- $ports := list (int .Values.mcpServer.port) (int .Values.proxy.port) (int .Values.proxy.adminPort) -}}
{{- if ne (len (uniq $ports)) 3 -}}
{{- fail (printf "mcpServer.port, proxy.port and proxy.adminPort must differ (they share the pod's network): %v" $ports) -}}
{{- end -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (int .Values.proxy.config.shutdown.grace_secs) -}}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be larger than proxy.config.shutdown.grace_secs (%d), or the kubelet kills the proxy mid-drain" (int .Values.terminationGracePeriodSeconds) (int .Values.proxy.config.shutdown.grace_secs)) -}}
{{- end -}}
{{- $log := .Values.proxy.config.log -}}
{{- if lt (int64 $log.max_total_bytes) (int64 $log.max_bytes_per_session) -}}
{{- fail "proxy.config.log.max_total_bytes must be at least proxy.config.log.max_bytes_per_session" -}}
{{- end -}}
{{- $c := .Values.proxy.config -}}
{{- if ne (len (uniq (list $c.legacy.sse_path $c.legacy.message_path $c.streamable.path))) 3 -}}
{{- fail "proxy.config.legacy.sse_path, legacy.message_path and streamable.path must differ" -}}
{{- end -}}
{{- $tls := .Values.tls -}}
{{- if and $tls.clientCaSecretName (not $tls.secretName) -}}
{{- fail "tls.clientCaSecretName needs tls.secretName (mutual TLS is TLS: the proxy asks for client certificates only on a TLS listener)" -}}
{{- end -}}
{{- if and .Values.jwks.secretName .Values.jwks.configMapName -}}
{{- fail "jwks: set secretName or configMapName, not both" -}}
{{- end -}}
{{- if eq ($c.auth.mode | default "opaque") "jwt" -}}
{{- if not (or .Values.jwks.secretName .Values.jwks.configMapName) -}}
{{- fail "proxy.config.auth.mode = jwt needs the issuer's keys: jwks.secretName or jwks.configMapName" -}}
{{- end -}}
{{- if or (not $c.auth.issuer) (not $c.auth.audience) -}}
{{- fail "proxy.config.auth.mode = jwt needs proxy.config.auth.issuer and proxy.config.auth.audience" -}}
{{- end -}}
{{- end -}}
{{- if and $tls.upstreamCa.secretName $tls.upstreamCa.configMapName -}}
{{- fail "tls.upstreamCa: set secretName or configMapName, not both" -}}
{{- end -}}
{{- if and $tls.secretName (not .Values.podSecurityContext.fsGroup) -}}
{{- fail "tls.secretName needs podSecurityContext.fsGroup (default 65532): the key file is mounted with mode 0440, readable by that group" -}}
{{- end -}}
{{- $redisUrl := .Values.proxy.redis.urlSecret -}}
{{- $keys := .Values.proxy.cluster.keysSecret -}}
{{- if include "mcp-resume-proxy.redis" . -}}
{{- if and $redisUrl.name $c.log.redis.url -}}
{{- fail "set proxy.redis.urlSecret.name or proxy.config.log.redis.url, not both (the proxy refuses log.redis.url_file with log.redis.url)" -}}
{{- end -}}
{{- if not (or $redisUrl.name $c.log.redis.url) -}}
{{- fail "proxy.config.log.backend = redis needs the Redis URL: proxy.redis.urlSecret.name (a Secret holding it; use this for a URL with a password) or proxy.config.log.redis.url" -}}
{{- end -}}
{{- else if $redisUrl.name -}}
{{- fail "proxy.redis.urlSecret needs proxy.config.log.backend = redis" -}}
{{- end -}}
{{- if contains "@" ($c.log.redis.url | default "") -}}
{{- fail "proxy.config.log.redis.url must not carry credentials (it is rendered into a ConfigMap): put the URL in a Secret and name it in proxy.redis.urlSecret" -}}
{{- end -}}
{{- if include "mcp-resume-proxy.forwarding" . -}}
{{- if not (include "mcp-resume-proxy.redis" .) -}}
{{- fail "proxy.cluster.forwarding needs proxy.config.log.backend = redis (writes are forwarded to the replica owning the session on Redis)" -}}
{{- end -}}
{{- if not $keys.name -}}
{{- fail "proxy.cluster.forwarding needs proxy.cluster.keysSecret.name (forwards are signed with its forwarding secret, cluster.secret_file)" -}}
{{- end -}}
{{- if ne (len (uniq (append $ports (int .Values.proxy.cluster.internalPort)))) 4 -}}
{{- fail (printf "proxy.cluster.internalPort (%d) must differ from mcpServer.port, proxy.port and proxy.adminPort" (int .Values.proxy.cluster.internalPort)) -}}
{{- end -}}
{{- end -}}
{{- if and (or $redisUrl.name $keys.name) (not .Values.podSecurityContext.fsGroup) -}}
{{- fail "proxy.redis.urlSecret and proxy.cluster.keysSecret need podSecurityContext.fsGroup (default 65532): their files are mounted with mode 0440, readable by that group" -}}
{{- end -}}
{{- end }}
