{{/*
Chart name, overridable with nameOverride; at most 63 characters (a DNS label).
*/}}
{{- define "agentrun-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name used as the prefix of every object: fullnameOverride, or "<release>-<name>", or just the
release name when it already contains the chart name.
*/}}
{{- define "agentrun-operator.fullname" -}}
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

{{/*
"name-version" for the helm.sh/chart label.
*/}}
{{- define "agentrun-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels that select the operator pod. They never change between upgrades (selectors are immutable).
*/}}
{{- define "agentrun-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentrun-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels on every object of the chart.
*/}}
{{- define "agentrun-operator.labels" -}}
helm.sh/chart: {{ include "agentrun-operator.chart" . }}
{{ include "agentrun-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: agentrun
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Name of the operator's service account.
*/}}
{{- define "agentrun-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agentrun-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Image reference: repository, then @digest when a digest is set, else :tag (default appVersion).
*/}}
{{- define "agentrun-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The namespaces watched in "namespaces" scope, validated: at least one, no duplicates.
Returns them as a YAML list (use with fromYamlArray).
*/}}
{{- define "agentrun-operator.watchNamespaces" -}}
{{- if eq .Values.rbac.scope "namespaces" }}
{{- if not .Values.watchNamespaces }}
{{- fail "rbac.scope is \"namespaces\" but watchNamespaces is empty: list the namespaces to watch" }}
{{- end }}
{{- if ne (len .Values.watchNamespaces) (len (uniq .Values.watchNamespaces)) }}
{{- fail "watchNamespaces lists a namespace more than once" }}
{{- end }}
{{- end }}
{{- toYaml .Values.watchNamespaces }}
{{- end }}

{{/*
RBAC rules for the namespaced resources the operator works with. Used by the ClusterRole in
"cluster" scope and by the Role in each watched namespace in "namespaces" scope.
*/}}
{{- define "agentrun-operator.namespacedRules" -}}
# The AgentRuns themselves: Kopf lists and watches them and removes the finalizer earlier builds
# put on runs; finished runs are deleted after spec.ttlSecondsAfterFinished; AgentSchedules create
# runs, cancel them (Replace) and delete them beyond their history limits; agent tools create
# child runs, read them (get) while they wait, cancel and delete them with their parent.
- apiGroups: ["agentrun.dev"]
  resources: ["agentruns"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Status is written through the status subresource only, as merge patches.
- apiGroups: ["agentrun.dev"]
  resources: ["agentruns/status"]
  verbs: ["patch"]
# AgentRunQuotas are read and watched; only their status (the ledger of use) is written, each change
# a read and a replace with the resourceVersion read, so concurrent writers never lose an update. With
# the ledgers in PostgreSQL (operator.quotaLedger) the status is a copy of the totals, merge-patched.
- apiGroups: ["agentrun.dev"]
  resources: ["agentrunquotas"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["agentrun.dev"]
  resources: ["agentrunquotas/status"]
  verbs: {{ if eq .Values.operator.quotaLedger "postgres" }}["update", "patch"]{{ else }}["update"]{{ end }}
# Agents are read (a run with spec.agentRef records its Agent's spec once) and watched (runs waiting
# for their Agent start when it is created); only their status (the validation verdict) is written,
# as merge patches.
- apiGroups: ["agentrun.dev"]
  resources: ["agents"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["agentrun.dev"]
  resources: ["agents/status"]
  verbs: ["patch"]
# AgentSchedules are listed and watched (Kopf); only their status is written, as merge patches.
- apiGroups: ["agentrun.dev"]
  resources: ["agentschedules"]
  verbs: ["list", "watch"]
- apiGroups: ["agentrun.dev"]
  resources: ["agentschedules/status"]
  verbs: ["patch"]
# SandboxTemplates are read (a run with spec.sandbox.templateRef records its template's spec once) and
# watched (runs waiting for their template start when it is created; warm pools follow it). Never written.
- apiGroups: ["agentrun.dev"]
  resources: ["sandboxtemplates"]
  verbs: ["get", "list", "watch"]
# Transcripts and run keys are owned by their AgentRun with blockOwnerDeletion, which the
# OwnerReferencesPermissionEnforcement admission plugin allows only with update on finalizers.
- apiGroups: ["agentrun.dev"]
  resources: ["agentruns/finalizers"]
  verbs: ["update"]
# Kubernetes Events on the runs (core/v1; a repeated event patches its count).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# Run API keys (read), the Secrets a sandbox mounts (their existence) and transcripts, stored as
# Secrets owned by the run, each read by its name. No list and no watch: a run waiting for a Secret
# re-reads it.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
# A run's sandbox (spec.sandbox): the NetworkPolicy that denies its pod's egress but for what the run
# declares, owned by the run. The pod itself is created by the run's ServiceAccount (impersonation).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "delete"]
# ConfigMaps a sandbox mounts (spec.sandbox.volumes): a run waits until they exist, each read by its
# name (as its metadata only, like the Secrets a sandbox mounts).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get"]
{{- if eq .Values.operator.transcriptStorage "configmap" }}
# Transcripts stored as ConfigMaps owned by the run (operator.transcriptStorage: configmap).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["create"]
{{- end }}
{{- if .Values.rbac.impersonateServiceAccounts }}
# The agent's Kubernetes tools act as the run's spec.serviceAccountName. Service accounts only:
# never users, groups or other identities.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["impersonate"]
  {{- with .Values.rbac.impersonationServiceAccountNames }}
  resourceNames:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}

{{/*
RBAC rules for what Kopf needs cluster-wide: discovering the CRD and, when it serves a list of
namespaces, watching which of them exist. Nothing namespaced belongs here.
*/}}
{{- define "agentrun-operator.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if eq .Values.rbac.scope "namespaces" }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- end }}
