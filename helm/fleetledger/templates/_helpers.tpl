{{/* Names, labels and shared fragments of the fleetledger chart. */}}

{{- define "fleetledger.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart>, or the release name when it already holds the chart name. */}}
{{- define "fleetledger.fullname" -}}
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

{{/* A component's name: <fullname>-<component>, e.g. "fleet-fleetledger-coordinator"; at most
52 characters, the full name cut so that the component stays (names stay distinct): a
StatefulSet labels each pod controller-revision-hash=<its name>-<10-character hash>, a label
value of at most 63, so a longer set name never gets a pod. */}}
{{- define "fleetledger.component" -}}
{{- $room := sub 51 (len .component) | int }}
{{- printf "%s-%s" (include "fleetledger.fullname" .root | trunc $room | trimSuffix "-") .component }}
{{- end }}

{{- define "fleetledger.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; call with (dict "root" $ "component" "coordinator"). */}}
{{- define "fleetledger.labels" -}}
helm.sh/chart: {{ include "fleetledger.chart" .root }}
{{ include "fleetledger.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: fleetledger
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels: stable across upgrades, so never the version. */}}
{{- define "fleetledger.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleetledger.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "fleetledger.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fleetledger.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "fleetledger.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Where the services are: the chart's own, else the external URL from values. */}}
{{- define "fleetledger.natsUrl" -}}
{{- if .Values.nats.enabled }}
{{- $name := include "fleetledger.component" (dict "root" . "component" "nats") }}
{{- if gt (int .Values.nats.replicas) 1 }}
{{- /* every server by its pod's name: a client moves to a live one when its own dies */}}
{{- $urls := list }}
{{- range $i := until (int .Values.nats.replicas) }}
{{- $urls = append $urls (printf "nats://%s-%d.%s-headless.%s.svc:4222" $name $i $name $.Release.Namespace) }}
{{- end }}
{{- join "," $urls }}
{{- else }}
{{- printf "nats://%s:4222" $name }}
{{- end }}
{{- else }}
{{- required "nats.externalUrl is required when nats.enabled is false" .Values.nats.externalUrl }}
{{- end }}
{{- end }}

{{- define "fleetledger.redisUrl" -}}
{{- if and .Values.redis.enabled .Values.redis.auth.enabled }}
{{- printf "redis://%s:$(REDIS_PASSWORD)@%s:6379/0" .Values.redis.auth.username (include "fleetledger.component" (dict "root" . "component" "redis")) }}
{{- else if .Values.redis.enabled }}
{{- printf "redis://%s:6379/0" (include "fleetledger.component" (dict "root" . "component" "redis")) }}
{{- else }}
{{- required "redis.externalUrl is required when redis.enabled is false" .Values.redis.externalUrl }}
{{- end }}
{{- end }}

{{- define "fleetledger.otelEndpoint" -}}
{{- if .Values.otel.endpoint }}
{{- .Values.otel.endpoint }}
{{- else if .Values.jaeger.enabled }}
{{- printf "http://%s:4318" (include "fleetledger.component" (dict "root" . "component" "jaeger")) }}
{{- end }}
{{- end }}

{{/* Settings every fleetledger process shares; goes into the ConfigMap. */}}
{{- define "fleetledger.commonConfig" -}}
FLEET_NATS_URL: {{ include "fleetledger.natsUrl" . | quote }}
{{- $otel := include "fleetledger.otelEndpoint" . }}
{{- if and .Values.otel.enabled $otel }}
OTEL_EXPORTER_OTLP_ENDPOINT: {{ $otel | quote }}
OTEL_EXPORTER_OTLP_PROTOCOL: {{ .Values.otel.protocol | quote }}
OTEL_TRACES_EXPORTER: "otlp"
{{- else }}
OTEL_SDK_DISABLED: "true"
OTEL_TRACES_EXPORTER: "none"
{{- end }}
{{- with .Values.ray.address }}
RAY_ADDRESS: {{ . | quote }}
{{- end }}
PYTHONDONTWRITEBYTECODE: "1"
PYTHONUNBUFFERED: "1"
HOME: "/tmp"
{{- end }}

{{/* Env that must be per pod or secret (env wins over envFrom, so the Secret overrides values). */}}
{{- define "fleetledger.podEnv" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: NODE_NAME
  valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
{{- with .Values.existingSecret }}
{{- if and .name .natsUrlKey }}
- name: FLEET_NATS_URL
  valueFrom: {secretKeyRef: {name: {{ .name | quote }}, key: {{ .natsUrlKey | quote }}}}
{{- end }}
{{- if and .name .redisUrlKey }}
- name: FLEET_REDIS_URL
  valueFrom: {secretKeyRef: {name: {{ .name | quote }}, key: {{ .redisUrlKey | quote }}}}
{{- end }}
{{- end }}
{{- end }}

{{/* OTEL_SERVICE_NAME and resource attributes for one component. */}}
{{- define "fleetledger.otelEnv" -}}
- name: OTEL_SERVICE_NAME
  value: {{ printf "fleetledger-%s" .component | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ printf "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE),k8s.node.name=$(NODE_NAME)%s" (ternary (printf ",%s" .root.Values.otel.resourceAttributes) "" (ne .root.Values.otel.resourceAttributes "")) | quote }}
{{- end }}

{{/*
Exec probe for the node agent: its HTTP listener binds loopback only (node_agent/daemon.py), which a
kubelet httpGet cannot reach, so the probe asks /healthz or /readyz over the Unix socket.
*/}}
{{- define "fleetledger.nodeAgentProbe" -}}
exec:
  command:
    - python
    - -c
    - "import os,socket,sys;s=socket.socket(socket.AF_UNIX);s.settimeout(4);s.connect(os.environ['FLEET_SOCKET']);s.sendall(b'GET {{ . }} HTTP/1.1\\r\\nHost: node-agent\\r\\nConnection: close\\r\\n\\r\\n');sys.exit(0 if s.recv(64).startswith(b'HTTP/1.1 200') else 1)"
{{- end }}

{{- define "fleetledger.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The loopback judge container; (dict "root" $ "native" true) makes it a native sidecar. */}}
{{- define "fleetledger.judgeContainer" -}}
{{- $root := .root }}
{{- $j := $root.Values.nodeAgent.judge }}
- name: judge
  image: {{ printf "%s:%s" $j.image.repository $j.image.tag | quote }}
  imagePullPolicy: {{ $j.image.pullPolicy }}
  {{- if .native }}
  # A native sidecar: up before the node agent starts, stopped after it exits.
  restartPolicy: Always
  {{- end }}
  command: ["/bin/sh", "-c"]
  args:
    - |
      ollama serve & server=$!
      trap 'kill -TERM "$server"' TERM INT
      {{- if $j.pullModel }}
      until ollama list >/dev/null 2>&1; do sleep 1; done
      ollama pull "$JUDGE_MODEL" || echo "judge: pulling $JUDGE_MODEL failed; the node agent keeps its deterministic auditor" >&2
      {{- end }}
      wait "$server"
  env:
    # Loopback only: reachable from the node agent in this pod, from nowhere else.
    - name: OLLAMA_HOST
      value: {{ printf "127.0.0.1:%d" (int $j.port) | quote }}
    - name: OLLAMA_MODELS
      value: /models
    - name: HOME
      value: /tmp
    - name: JUDGE_MODEL
      value: {{ $j.model | quote }}
    {{- with $j.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  # No ports declared and no Service: the judge is never a network endpoint. The probes exec
  # the ollama client, which talks to OLLAMA_HOST inside the pod.
  startupProbe:
    exec: {command: ["ollama", "list"]}
    periodSeconds: 2
    failureThreshold: 60
  readinessProbe:
    exec: {command: ["ollama", "show", {{ $j.model | quote }}]}
    periodSeconds: 10
    timeoutSeconds: 5
  livenessProbe:
    exec: {command: ["ollama", "list"]}
    periodSeconds: 20
    timeoutSeconds: 5
    failureThreshold: 6
  resources:
    {{- toYaml $j.resources | nindent 4 }}
  securityContext:
    {{- toYaml $root.Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: judge-models
      mountPath: /models
    - name: judge-tmp
      mountPath: /tmp
{{- end }}

{{/*
The bundled nats-server's configuration: JetStream on /data, fsync per write by default
(sync_interval: always), the server named after its pod. With replicas > 1, one node of a
cluster: routes to every pod of the StatefulSet (its own too: nats-server skips it), each URL
from the container's env (NATS_ROUTE_<i>, which carries the routes' password from its Secret:
nats.conf expands a variable as a whole value, never inside a string).
*/}}
{{- define "fleetledger.natsConfig" -}}
port: 4222
http_port: 8222
server_name: $POD_NAME
jetstream {
  store_dir: /data
  sync_interval: {{ .Values.nats.syncInterval }}
}
{{- if gt (int .Values.nats.replicas) 1 }}
cluster {
  name: {{ include "fleetledger.component" (dict "root" . "component" "nats") }}
  port: {{ .Values.nats.cluster.port }}
  {{- if .Values.nats.cluster.auth.enabled }}
  authorization {
    user: route
    password: $NATS_ROUTE_PASSWORD
  }
  {{- end }}
  routes: [
    {{- range $i := until (int .Values.nats.replicas) }}
    $NATS_ROUTE_{{ $i }}
    {{- end }}
  ]
}
{{- end }}
{{- if .Values.identity.enabled }}
# One nkey user per principal with its role's permissions, as `fleetledger identity
# helm-values` rendered them from fleetbus/permissions.py (JSON is nats.conf syntax too;
# toJson escapes > < & as \u00XX, which nats.conf does not read, so they are put back).
authorization: {{ toJson .Values.identity.natsAuthorization | replace "\\u003e" ">" | replace "\\u003c" "<" | replace "\\u0026" "&" }}
{{- end }}
{{- end }}

{{/*
Identity (docs/security.md). Refuses to render a fleet whose identity values cannot work, before
anything is applied: identity on without principals, an authorization block that is not the
principals' (re-run `fleetledger identity helm-values`), no coordinator principal or Secret.
*/}}
{{- define "fleetledger.identityCheck" -}}
{{- $id := .Values.identity }}
{{- if $id.enabled }}
{{- $fix := "run `fleetledger identity helm-values --out DIR` and pass -f DIR/identity-values.json (or set identity.enabled=false: INSECURE, anyone reaching NATS can forge events)" }}
{{- if not $id.principals }}
{{- fail (printf "identity.enabled is true but identity.principals is empty: %s" $fix) }}
{{- end }}
{{- $want := list }}
{{- range $id.principals }}{{ if not .revoked }}{{ $want = append $want .public_key }}{{ end }}{{ end }}
{{- $have := list }}
{{- range (($id.natsAuthorization).users | default list) }}{{ $have = append $have .nkey }}{{ end }}
{{- if ne (sortAlpha $want | join ",") (sortAlpha $have | join ",") }}
{{- fail (printf "identity.natsAuthorization does not have one user per unrevoked principal of identity.principals: %s" $fix) }}
{{- end }}
{{- $c := $id.coordinator.principal }}
{{- $found := false }}
{{- range $id.principals }}{{ if and (eq .name $c) (eq .role "coordinator") (not .revoked) }}{{ $found = true }}{{ end }}{{ end }}
{{- if not $found }}
{{- fail (printf "identity.coordinator.principal %q is no unrevoked coordinator of identity.principals: %s" $c $fix) }}
{{- end }}
{{- if not $id.coordinator.existingSecret }}
{{- fail (printf "identity.coordinator.existingSecret is empty: %s" $fix) }}
{{- end }}
{{- if and .Values.nodeAgent.enabled (not $id.nodeAgent.existingSecretPrefix) }}
{{- fail (printf "identity.nodeAgent.existingSecretPrefix is empty: %s" $fix) }}
{{- end }}
{{- if not .Values.podSecurityContext.fsGroup }}
{{- fail "identity.enabled needs podSecurityContext.fsGroup: the identity Secrets are mounted readable by that group only" }}
{{- end }}
{{- end }}
{{- if and .Values.redis.enabled .Values.redis.auth.enabled (not .Values.redis.auth.existingSecret) }}
{{- fail "redis.auth.existingSecret is empty: create a Secret with the coordinator's Redis password (kubectl create secret generic fleetledger-redis --from-literal=password=\"$(openssl rand -hex 32)\") and set redis.auth.existingSecret=fleetledger-redis (or redis.auth.enabled=false: INSECURE)" }}
{{- end }}
{{- if .Values.nats.enabled }}
{{- $replicas := int .Values.nats.replicas }}
{{- if gt (int .Values.coordinator.settings.streamReplicas) $replicas }}
{{- fail (printf "coordinator.settings.streamReplicas %d exceeds nats.replicas %d: JetStream places each replica on its own server; set streamReplicas to %d (or nats.replicas=3)" (int .Values.coordinator.settings.streamReplicas) $replicas $replicas) }}
{{- end }}
{{- if and (gt $replicas 1) .Values.nats.cluster.auth.enabled (not .Values.nats.cluster.auth.existingSecret) }}
{{- fail "nats.cluster.auth.existingSecret is empty: create a Secret with the NATS routes' password (kubectl create secret generic fleetledger-nats-routes --from-literal=password=\"$(openssl rand -hex 32)\") and set nats.cluster.auth.existingSecret=fleetledger-nats-routes (or nats.cluster.auth.enabled=false: INSECURE, any pod reaching the route port joins the cluster)" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fleetledger.identityDir" -}}
/etc/fleetledger/identity
{{- end }}

{{/*
Env of a pod that runs as a principal; call with (dict "root" $ "principal" "NAME" or
"$(NODE_NAME)"). The bundled Redis's password comes with the coordinator's Redis URL.
*/}}
{{- define "fleetledger.identityEnv" -}}
{{- if .root.Values.identity.enabled }}
- name: FLEET_PRINCIPAL
  value: {{ .principal | quote }}
- name: FLEET_IDENTITY_DIR
  value: {{ include "fleetledger.identityDir" .root | quote }}
{{- end }}
{{- end }}

{{/*
Copies this pod's own seed (and the public directory) from the mounted Secret into a memory
emptyDir, owned by the pod's user with mode 0400: Secret files are root-owned and
group-readable (fsGroup), which the key store refuses as readable by others, and a node
agent must see its own node's seed only. Call with (dict "root" $ "principal" "..." "secret" "...").
*/}}
{{- define "fleetledger.identityInit" -}}
- name: identity
  image: {{ include "fleetledger.image" .root | quote }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command: ["/bin/sh", "-ec"]
  args:
    - |
      umask 077
      seed="/identity-source/$FLEET_PRINCIPAL.seed"
      if [ ! -f "$seed" ]; then
        echo "identity: no seed for principal '$FLEET_PRINCIPAL' in Secret {{ .secret }}: run 'fleetledger identity create $FLEET_PRINCIPAL --role ...', then 'fleetledger identity helm-values', apply its Secrets and upgrade with its values" >&2
        exit 2
      fi
      rm -f "$FLEET_IDENTITY_DIR/$FLEET_PRINCIPAL.seed" "$FLEET_IDENTITY_DIR/principals.json"
      cp "$seed" "$FLEET_IDENTITY_DIR/$FLEET_PRINCIPAL.seed"
      cp /identity-source/principals.json "$FLEET_IDENTITY_DIR/principals.json"
  env:
    - name: NODE_NAME
      valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
    {{- include "fleetledger.identityEnv" . | nindent 4 }}
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {cpu: 100m, memory: 64Mi}
  securityContext:
    {{- toYaml .root.Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: identity-source
      mountPath: /identity-source
      readOnly: true
    - name: identity
      mountPath: {{ include "fleetledger.identityDir" .root }}
{{- end }}

{{/* The volumes of a pod that runs as a principal: (dict "root" $ "secret" "NAME"). */}}
{{- define "fleetledger.identityVolumes" -}}
# The public directory and the seeds, readable by fsGroup; only the init container mounts it.
- name: identity-source
  projected:
    defaultMode: 0440
    sources:
      - configMap:
          name: {{ include "fleetledger.component" (dict "root" .root "component" "identity") }}
      - secret:
          name: {{ .secret | quote }}
# This pod's own seed, 0400, in memory.
- name: identity
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end }}

{{/* The identity directory mounted read-only into a container that runs as a principal. */}}
{{- define "fleetledger.identityMount" -}}
- name: identity
  mountPath: {{ include "fleetledger.identityDir" . }}
  readOnly: true
{{- end }}

{{/* The bundled Redis's ACL user and password (from redis.auth.existingSecret). */}}
{{- define "fleetledger.redisAuthEnv" -}}
- name: REDIS_USER
  value: {{ .Values.redis.auth.username | quote }}
- name: REDIS_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ .Values.redis.auth.existingSecret | quote }}, key: {{ .Values.redis.auth.passwordKey | quote }}}}
{{- end }}

{{/*
The bundled NATS's route env: the routes' password from its Secret, and one URL per pod of the
StatefulSet (Kubernetes expands $(NATS_ROUTE_PASSWORD) in them; the password stays out of the
ConfigMap and of the command line).
*/}}
{{- define "fleetledger.natsRouteEnv" -}}
{{- $name := include "fleetledger.component" (dict "root" . "component" "nats") }}
{{- $auth := .Values.nats.cluster.auth }}
{{- if $auth.enabled }}
- name: NATS_ROUTE_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ $auth.existingSecret | quote }}, key: {{ $auth.passwordKey | quote }}}}
{{- end }}
{{- range $i := until (int .Values.nats.replicas) }}
- name: {{ printf "NATS_ROUTE_%d" $i }}
  value: {{ printf "nats-route://%s%s-%d.%s-headless.%s.svc:%d" (ternary "route:$(NATS_ROUTE_PASSWORD)@" "" $auth.enabled) $name $i $name $.Release.Namespace (int $.Values.nats.cluster.port) | quote }}
{{- end }}
{{- end }}

{{/* The pods of a component spread over Kubernetes nodes (topology kubernetes.io/hostname):
its values' "affinity" when set, else a pod anti-affinity on its own pods, "soft" (preferred)
or "hard" (required) as its "antiAffinity" says. Call with (dict "root" $ "component" NAME
"values" ITS_VALUES). */}}
{{- define "fleetledger.spreadAffinity" -}}
{{- if .values.affinity }}
{{- toYaml .values.affinity }}
{{- else }}
{{- $term := dict "labelSelector" (dict "matchLabels" (include "fleetledger.selectorLabels" (dict "root" .root "component" .component) | fromYaml)) "topologyKey" "kubernetes.io/hostname" }}
podAntiAffinity:
{{- if eq .values.antiAffinity "hard" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    {{- list $term | toYaml | nindent 4 }}
{{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    {{- list (dict "weight" 100 "podAffinityTerm" $term) | toYaml | nindent 4 }}
{{- end }}
{{- end }}
{{- end }}
