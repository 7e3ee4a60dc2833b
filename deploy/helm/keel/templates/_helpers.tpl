{{/* Name prefix of every object: <release>-keel, or fullnameOverride. */}}
{{- define "keel.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-keel" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "keel.labels" -}}
app.kubernetes.io/name: keel
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- range $k, $v := .Values.labels }}
{{ $k }}: {{ $v | quote }}
{{- end }}
{{- end -}}

{{/* The Secret with databaseUrl, operatorKey, sponsorKey, operatorKmsKeyId, sponsorKmsKeyId. */}}
{{- define "keel.secretName" -}}
{{- if .Values.secret.create -}}
{{- include "keel.fullname" . -}}
{{- else -}}
{{- required "secret.existingSecret is required when secret.create is false" .Values.secret.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "keel.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Pod security: the image's numeric non-root user, read-only root filesystem. */}}
{{- define "keel.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
{{- end -}}

{{- define "keel.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* Env of every role: the configuration file, the listen addresses, the database. */}}
{{- define "keel.commonEnv" -}}
- name: KEEL_CONFIG
  value: /etc/keel/keel.toml
- name: KEEL__API__LISTENADDRESS
  value: "0.0.0.0:{{ .Values.ports.api }}"
- name: KEEL__TELEMETRY__METRICSADDRESS
  value: "0.0.0.0:{{ .Values.ports.metrics }}"
- name: KEEL__DATABASE__URL
  valueFrom:
    secretKeyRef:
      name: {{ include "keel.secretName" . }}
      key: databaseUrl
{{- end -}}

{{/* The operator key (runner and api roles). */}}
{{- define "keel.operatorEnv" -}}
- name: KEEL__OPERATOR__KEYENV
  value: {{ .Values.operator.keyEnv | quote }}
{{- if eq .Values.operator.signerKind "awsKms" }}
- name: KEEL__OPERATOR__SIGNER__KIND
  value: awsKms
- name: KEEL__OPERATOR__SIGNER__KEYID
  valueFrom:
    secretKeyRef:
      name: {{ include "keel.secretName" . }}
      key: operatorKmsKeyId
- name: KEEL__OPERATOR__SIGNER__REGION
  value: {{ .Values.operator.kmsRegion | quote }}
{{- else }}
- name: {{ .Values.operator.keyEnv }}
  valueFrom:
    secretKeyRef:
      name: {{ include "keel.secretName" . }}
      key: operatorKey
      optional: true
{{- end }}
{{- end -}}

{{/* The sponsor key (api role). */}}
{{- define "keel.sponsorEnv" -}}
- name: KEEL__AA__SPONSORKEYENV
  value: {{ .Values.sponsor.keyEnv | quote }}
{{- if eq .Values.sponsor.signerKind "awsKms" }}
- name: KEEL__AA__SPONSORSIGNER__KIND
  value: awsKms
- name: KEEL__AA__SPONSORSIGNER__KEYID
  valueFrom:
    secretKeyRef:
      name: {{ include "keel.secretName" . }}
      key: sponsorKmsKeyId
- name: KEEL__AA__SPONSORSIGNER__REGION
  value: {{ .Values.sponsor.kmsRegion | quote }}
{{- else }}
- name: {{ .Values.sponsor.keyEnv }}
  valueFrom:
    secretKeyRef:
      name: {{ include "keel.secretName" . }}
      key: sponsorKey
      optional: true
{{- end }}
{{- end -}}

{{/* The configuration file and a writable /tmp. */}}
{{- define "keel.volumeMounts" -}}
- name: config
  mountPath: /etc/keel
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- end -}}

{{- define "keel.volumes" -}}
- name: config
  configMap:
    name: {{ include "keel.fullname" . }}
- name: tmp
  emptyDir: {}
{{- end -}}

{{- define "keel.scheduling" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
