{{- define "proxmox-csi.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "proxmox-csi.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "proxmox-csi.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "proxmox-csi.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "proxmox-csi.labels" -}}
app.kubernetes.io/name: {{ include "proxmox-csi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "proxmox-csi.secretName" -}}
{{- default (include "proxmox-csi.fullname" .) .Values.existingConfigSecret -}}
{{- end -}}

{{/* A container that needs nothing: no privileges, no capabilities, read-only. */}}
{{- define "proxmox-csi.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "proxmox-csi.image" -}}
{{ .repository }}:{{ .tag }}
{{- end -}}

{{/* The livenessprobe sidecar, serving /healthz on the given port. */}}
{{- define "proxmox-csi.livenessSidecar" -}}
- name: liveness-probe
  image: {{ include "proxmox-csi.image" .root.Values.livenessprobe.image }}
  imagePullPolicy: {{ .root.Values.livenessprobe.image.pullPolicy }}
  args:
    - --csi-address=/csi/csi.sock
    - --health-port={{ .port }}
  securityContext:
    {{- include "proxmox-csi.restricted" . | nindent 4 }}
  resources:
    {{- toYaml .root.Values.livenessprobe.resources | nindent 4 }}
  volumeMounts:
    - name: {{ .volume }}
      mountPath: /csi
{{- end -}}

{{- define "proxmox-csi.livenessProbe" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: healthz
  initialDelaySeconds: {{ .Values.livenessprobe.initialDelaySeconds }}
  timeoutSeconds: {{ .Values.livenessprobe.timeoutSeconds }}
  periodSeconds: {{ .Values.livenessprobe.periodSeconds }}
  failureThreshold: {{ .Values.livenessprobe.failureThreshold }}
{{- end -}}
