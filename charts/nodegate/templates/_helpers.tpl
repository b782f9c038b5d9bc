{{/*
The gate: which generated variant of the confinement policies, the webhook
configuration, the admission policy and the workloads' taint arguments is
installed (charts/nodegate/generate, axis `gate`). values.schema.json refuses
the combinations kustomize does not support; this repeats it for --skip-schema-validation.
*/}}
{{- define "nodegate.gate" -}}
{{- $v := .Values -}}
{{- if and $v.strictMode.enabled (ne $v.profile "default") -}}
{{- fail (printf "strictMode.enabled cannot be combined with profile %q: their confinements replace each other (generate one component with both flags: manifests/components/key-profiles/*/kustomization.yaml)" $v.profile) -}}
{{- end -}}
{{- if and $v.releaseCiliumKey.enabled (or $v.strictMode.enabled (ne $v.profile "default")) -}}
{{- fail "releaseCiliumKey.enabled works with the default profile only, without strictMode (manifests/components/release-cilium-key/kustomization.yaml)" -}}
{{- end -}}
{{- if and $v.gates (or $v.strictMode.enabled $v.releaseCiliumKey.enabled (ne $v.profile "default")) -}}
{{- fail (printf "gates %q is a whole gate set: not with a key profile, strictMode or releaseCiliumKey (put their taints in your own declaration: docs/gates.md)" $v.gates) -}}
{{- end -}}
{{- if $v.gates -}}{{ $v.gates }}
{{- else if $v.strictMode.enabled -}}strict-mode
{{- else if $v.releaseCiliumKey.enabled -}}release-cilium-key
{{- else -}}{{ $v.profile }}
{{- end -}}
{{- end -}}

{{/* The stored variant of one index entry: "gate-default.ap-0.cm-1", or "all". */}}
{{- define "nodegate.variant" -}}
{{- $root := index . 0 -}}
{{- $e := index . 1 -}}
{{- $parts := list -}}
{{- range $axis := ($e.axes | default list) -}}
{{- if eq $axis "gate" -}}{{- $parts = append $parts (printf "gate-%s" (include "nodegate.gate" $root)) -}}
{{- else if eq $axis "ap" -}}{{- $parts = append $parts (printf "ap-%d" (ternary 1 0 $root.Values.admissionPolicy.enabled)) -}}
{{- else if eq $axis "cm" -}}{{- $parts = append $parts (printf "cm-%d" (ternary 1 0 $root.Values.certManager.enabled)) -}}
{{- else -}}{{- fail (printf "files/index.yaml: unknown axis %q (charts/nodegate/generate and this template disagree)" $axis) -}}
{{- end -}}
{{- end -}}
{{- if $parts -}}{{ join "." $parts }}{{- else -}}all{{- end -}}
{{- end -}}

{{/* An image: <repository>/nodegate-<component>:<tag>, or @<digest> when pinned (as kustomize's digest). */}}
{{- define "nodegate.image" -}}
{{- $root := index . 0 -}}
{{- $c := index . 1 -}}
{{- $i := $root.Values.image -}}
{{- $name := printf "%s/nodegate-%s" $i.repository $c -}}
{{- $digest := index ($i.digests | default dict) $c | default "" -}}
{{- if $digest -}}{{ $name }}@{{ $digest }}
{{- else -}}{{ $name }}:{{ $i.tag | default $root.Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
A stored pod template's containers, set from values: the images of every
container, and for the workload's own values (.wv): resources, extra
arguments (main container), tolerations and nodeSelector (pod).
*/}}
{{- define "nodegate.podSpec" -}}
{{- $root := .root -}}
{{- $spec := .spec -}}
{{- $wv := .wv | default dict -}}
{{- range $c := concat ($spec.initContainers | default list) ($spec.containers | default list) -}}
{{- $comp := regexReplaceAll "^nodegate/nodegate-([a-z]+)(:.*)?$" $c.image "${1}" -}}
{{- if eq $comp $c.image -}}{{- fail (printf "stored image %q is not nodegate/nodegate-<component>" $c.image) -}}{{- end -}}
{{- $_ := set $c "image" (include "nodegate.image" (list $root $comp)) -}}
{{- $_ := set $c "imagePullPolicy" $root.Values.image.pullPolicy -}}
{{- end -}}
{{- $main := index $spec.containers 0 -}}
{{- if $wv.resources -}}{{- $_ := set $main "resources" $wv.resources -}}{{- end -}}
{{- if $wv.extraArgs -}}{{- $_ := set $main "args" (concat ($main.args | default list) $wv.extraArgs) -}}{{- end -}}
{{- if $wv.tolerations -}}{{- $_ := set $spec "tolerations" (concat ($spec.tolerations | default list) $wv.tolerations) -}}{{- end -}}
{{- if $wv.nodeSelector -}}{{- $_ := set $spec "nodeSelector" (merge (deepCopy $wv.nodeSelector) ($spec.nodeSelector | default dict)) -}}{{- end -}}
{{- end -}}

{{/*
The agent's probe arguments (docs/flags.md): a probe kind set in
agent.probes replaces that kind's arguments of the manifests, at the place
of their first probe argument; probePod adds --probe-pod at the end, as
manifests/components/probe-pod does.
*/}}
{{- define "nodegate.agentProbes" -}}
{{- $root := .root -}}
{{- if and $root.Values.gates (or $root.Values.probePod.enabled (values ($root.Values.agent.probes | default dict) | compact)) -}}
{{- fail (printf "gates %q: its declaration holds every gate's probes (the agent's --gates); agent.probes and probePod would contradict it (docs/gates.md)" $root.Values.gates) -}}
{{- end -}}
{{- $main := index .spec.containers 0 -}}
{{- $probes := $root.Values.agent.probes | default dict -}}
{{- $set := list -}}
{{- $new := list -}}
{{- range $k := list "http" "tcp" "file" "exec" -}}
{{- if kindIs "slice" (index $probes $k) -}}
{{- $set = append $set $k -}}
{{- range $p := index $probes $k -}}{{- $new = append $new (printf "--probe-%s=%s" $k $p) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if $set -}}
{{- $args := list -}}
{{- $placed := false -}}
{{- range $a := $main.args -}}
{{- $kind := regexReplaceAll "^--probe-(http|tcp|file|exec)=.*$" $a "${1}" -}}
{{- if and (not $placed) (or (has $kind $set) (has $kind (list "http" "tcp" "file" "exec"))) (ne $kind $a) -}}
{{- $args = concat $args $new -}}{{- $placed = true -}}
{{- end -}}
{{- if not (and (ne $kind $a) (has $kind $set)) -}}{{- $args = append $args $a -}}{{- end -}}
{{- end -}}
{{- if not $placed -}}{{- $args = concat $args $new -}}{{- end -}}
{{- $_ := set $main "args" $args -}}
{{- end -}}
{{- if $root.Values.probePod.enabled -}}
{{- $_ := set $main "args" (append $main.args (printf "--probe-pod=%s/%s" $root.Values.probePod.namespace $root.Values.probePod.selector)) -}}
{{- end -}}
{{- end -}}
