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

{{/* The Go chart's service account names: <name>-controller and <name>-node. */}}
{{- define "proxmox-csi.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "proxmox-csi.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Go driver's images under its chart's keys would run the Go driver
(or pull a tag this driver never had): refused, naming the key. The Go
chart's default repository with no tag (a copy of its values.yaml) means
"the chart's own image", which here is this driver's. */}}
{{- define "proxmox-csi.pluginImage" -}}
{{- $image := (index .root.Values .side).plugin.image -}}
{{- $repo := $image.repository -}}
{{- if eq $repo (printf "ghcr.io/sergelogvinov/proxmox-csi-%s" .side) -}}
{{- $repo = printf "ghcr.io/proxmox-csi-rs/proxmox-csi-%s" .side -}}
{{- end -}}
{{ $repo }}:{{ default .root.Chart.AppVersion $image.tag }}
{{- end -}}

{{- define "proxmox-csi.refuseGoImages" -}}
{{- range $side := list "controller" "node" }}
{{- $image := (index $.Values $side).plugin.image }}
{{- $goDefault := and (eq $image.repository (printf "ghcr.io/sergelogvinov/proxmox-csi-%s" $side)) (not $image.tag) }}
{{- if and (contains "sergelogvinov" (default "" $image.repository)) (not $goDefault) }}
{{- fail (printf "%s.plugin.image.repository is %q, the Go driver's image; this chart runs proxmox-csi-rs: remove the key, or name a mirror of %s" $side $image.repository (printf "ghcr.io/proxmox-csi-rs/proxmox-csi-%s" $side)) }}
{{- end }}
{{- if hasPrefix "v" (default "" $image.tag) }}
{{- fail (printf "%s.plugin.image.tag is %q, a Go driver tag; this chart's images are tagged like %q: remove the key to take the chart's" $side $image.tag $.Chart.AppVersion) }}
{{- end }}
{{- end }}
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
