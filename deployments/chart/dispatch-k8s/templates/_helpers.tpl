{{/*
The chart's hand-written templates. The objects' templates beside this file are written by the
release (release/chart.py) from the objects of its manifests; they call what is defined here.
*/}}

{{/*
An image's reference: REGISTRY/REPOSITORY[:TAG][@DIGEST], REGISTRY the image's own or images.registry.
Called with (list $ "controller"), the second item a key of .Values.images.
*/}}
{{- define "dispatch-k8s.image" -}}
{{- $root := index . 0 -}}
{{- $key := index . 1 -}}
{{- $image := index $root.Values.images $key -}}
{{- $registry := $image.registry | default $root.Values.images.registry -}}
{{- if not (or $image.tag $image.digest) -}}
{{- fail (printf "images.%s: give a tag or a digest" $key) -}}
{{- end -}}
{{- if $registry }}{{ $registry }}/{{ end }}{{ $image.repository }}
{{- with $image.tag }}:{{ . }}{{ end }}
{{- with $image.digest }}@{{ . }}{{ end }}
{{- end -}}

{{/* helm.sh/chart: the chart's name and version, as a label value (a version's + written _). */}}
{{- define "dispatch-k8s.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The sidecar's RoleBinding's subjects, as JSON: a ServiceAccount of sidecar.serviceAccounts each. */}}
{{- define "dispatch-k8s.sidecar-subjects" -}}
{{- $subjects := list -}}
{{- range $.Values.sidecar.serviceAccounts -}}
{{- $subjects = append $subjects (dict "kind" "ServiceAccount" "name" .) -}}
{{- end -}}
{{- toJson $subjects -}}
{{- end -}}
