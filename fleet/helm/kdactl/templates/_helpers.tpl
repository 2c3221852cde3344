{{- define "kdactl.labels" -}}
app.kubernetes.io/name: kdactl
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kdactl.selector" -}}
app.kubernetes.io/name: kdactl
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kdactl.checks" -}}
{{- if ge (int .Values.renewAfterHours) (mul (int .Values.certificateLifetimeDays) 24) -}}
{{- fail (printf "renewAfterHours (%d) must be shorter than certificateLifetimeDays (%d days = %d h): certificates would expire before they are renewed" (int .Values.renewAfterHours) (int .Values.certificateLifetimeDays) (mul (int .Values.certificateLifetimeDays) 24)) -}}
{{- end -}}
{{- with .Values.signing -}}
{{- if and .trustedKeysConfigMap (not .keyHostPath) -}}
{{- fail "signing.trustedKeysConfigMap needs signing.keyHostPath: with trusted keys kdactl gate accepts only a certificate signed by the node's own key, so a node that cannot sign would stay tainted" -}}
{{- end -}}
{{- end -}}
{{- end -}}
