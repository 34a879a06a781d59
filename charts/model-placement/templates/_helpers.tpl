{{/* Pod placement values applied to a Deployment from manifests/base: replicas, priority class, anti-affinity. */}}
{{- define "model-placement.placement" -}}
{{- $obj := index . 0 -}}{{- $v := index . 1 -}}{{- $image := index . 2 -}}
{{- $_ := set $obj.spec "replicas" (int $v.replicas) -}}
{{- $pod := $obj.spec.template.spec -}}
{{- if $v.priorityClassName }}{{- $_ := set $pod "priorityClassName" $v.priorityClassName -}}{{- end -}}
{{- if eq $v.antiAffinity "required" -}}
{{- $anti := $pod.affinity.podAntiAffinity -}}
{{- $terms := list -}}
{{- range $anti.preferredDuringSchedulingIgnoredDuringExecution }}{{- $terms = append $terms .podAffinityTerm -}}{{- end -}}
{{- $_ := set $pod.affinity "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" $terms) -}}
{{- else if ne $v.antiAffinity "preferred" -}}
{{- fail (printf "antiAffinity %q: use preferred or required" $v.antiAffinity) -}}
{{- end -}}
{{- range $pod.containers }}{{- if hasPrefix "model-placement:" .image }}{{- $_ := set . "image" (printf "%s:%s" $image.repository (toString $image.tag)) -}}{{- end -}}{{- end -}}
{{- end -}}
