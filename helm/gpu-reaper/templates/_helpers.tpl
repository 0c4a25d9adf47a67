{{/* Object name prefix: "gpu-reaper" unless overridden or the release name differs. */}}
{{- define "gpu-reaper.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpu-reaper.labels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: include with (list $ "controller"). */}}
{{- define "gpu-reaper.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ default $root.Chart.Name $root.Values.nameOverride }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "gpu-reaper.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}
{{- end -}}

{{/* restricted Pod Security, for every pod and container of the chart. */}}
{{- define "gpu-reaper.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpu-reaper.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Flags both components share: what counts as a GPU. */}}
{{- define "gpu-reaper.gpuArgs" -}}
- --gpu-resource={{ join "," .Values.gpu.resources }}
- --gpu-device-class={{ join "," .Values.gpu.deviceClasses }}
- --mig-slices-per-gpu={{ .Values.gpu.migSlicesPerGpu }}
{{- end -}}

{{/* Identities whose writes of controller-owned objects are not asked for an attestation again: the
binary's DEFAULT_TRUSTED_CONTROLLERS (src/admission/decide.rs) plus the listed operators. */}}
{{- define "gpu-reaper.trustedControllers" -}}
{{- $ids := list "system:kube-controller-manager" -}}
{{- range (list "replicaset-controller" "deployment-controller" "statefulset-controller" "daemon-set-controller" "job-controller" "cronjob-controller" "replication-controller" "resource-claim-controller") }}
{{- $ids = append $ids (printf "system:serviceaccount:kube-system:%s" .) -}}
{{- end -}}
{{- range .Values.webhook.trustedControllers }}{{ $ids = append $ids . }}{{ end -}}
{{- toJson (uniq $ids) -}}
{{- end -}}

{{/* Namespaces the budget gate never sees. */}}
{{- define "gpu-reaper.excludedNamespaces" -}}
{{- $ns := list "kube-system" "kube-node-lease" .Release.Namespace -}}
{{- range .Values.webhook.excludedNamespaces }}{{ $ns = append $ns . }}{{ end -}}
{{- toJson (uniq $ns) -}}
{{- end -}}

{{/* Default topology spread: replicas on different nodes when possible. */}}
{{- define "gpu-reaper.spread" -}}
{{- $root := index . 0 -}}
{{- $values := index . 1 -}}
{{- if $values.topologySpreadConstraints }}
{{- toYaml $values.topologySpreadConstraints }}
{{- else }}
- maxSkew: 1
  topologyKey: kubernetes.io/hostname
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "gpu-reaper.selector" (list $root (index . 2)) | nindent 6 }}
{{- end }}
{{- end -}}

{{/* The Secret holding the webhook's serving certificate. */}}
{{- define "gpu-reaper.webhookSecret" -}}
{{- if eq .Values.webhook.certificate.source "secret" -}}
{{- required "webhook.certificate.existingSecret is required with source secret: name a kubernetes.io/tls Secret in the release namespace" .Values.webhook.certificate.existingSecret -}}
{{- else -}}
{{- printf "%s-webhook-tls" (include "gpu-reaper.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* NetworkPolicy pieces (templates/networkpolicy.yaml). */}}
{{- define "gpu-reaper.np.common-egress" -}}
# DNS.
- ports:
  - {port: 53, protocol: UDP}
  - {port: 53, protocol: TCP}
# The API server (reflectors, writes, the Lease).
- ports:
  {{- range .apiServer.ports }}
  - {port: {{ . }}, protocol: TCP}
  {{- end }}
  {{- if .apiServer.cidrs }}
  to:
  {{- range .apiServer.cidrs }}
  - ipBlock: {cidr: {{ . }}}
  {{- end }}
  {{- end }}
{{- end }}
{{- define "gpu-reaper.np.metrics-ingress" -}}
- ports:
  - {port: {{ .port }}, protocol: TCP}
  {{- with .from }}
  from:
  - namespaceSelector:
      {{- toYaml . | nindent 6 }}
  {{- end }}
{{- end }}
