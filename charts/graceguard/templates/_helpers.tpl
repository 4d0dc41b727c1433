{{/* Chart name, truncated to a DNS label. */}}
{{- define "graceguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects; also the Service name, so a DNS label (63). */}}
{{- define "graceguard.fullname" -}}
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

{{- define "graceguard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "graceguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "graceguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end }}

{{/* Labels of every object, without the component. */}}
{{- define "graceguard.baseLabels" -}}
helm.sh/chart: {{ include "graceguard.chart" . }}
app.kubernetes.io/name: {{ include "graceguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: graceguard
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "graceguard.labels" -}}
{{ include "graceguard.baseLabels" . }}
app.kubernetes.io/component: webhook
{{- end }}

{{- define "graceguard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "graceguard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The webhook image: repository@digest when a digest is set, else repository:tag. */}}
{{- define "graceguard.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Secret holding tls.crt and tls.key (and ca.crt, except for some existing Secrets). */}}
{{- define "graceguard.tlsSecretName" -}}
{{- if eq .Values.certs.mode "existingSecret" }}
{{- required "certs.existingSecret.name is required when certs.mode is existingSecret" .Values.certs.existingSecret.name }}
{{- else }}
{{- printf "%s-tls" (include "graceguard.fullname" .) }}
{{- end }}
{{- end }}

{{/* Name of the cert-manager Certificate (certManager mode). */}}
{{- define "graceguard.certificateName" -}}
{{- printf "%s-serving" (include "graceguard.fullname" .) }}
{{- end }}

{{/* DNS names of the webhook Service, as a JSON list; the first is what the API server dials. */}}
{{- define "graceguard.serviceDNSNames" -}}
{{- $svc := include "graceguard.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- list (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns .Values.clusterDomain) (printf "%s.%s" $svc $ns) $svc | toJson }}
{{- end }}

{{/*
The self-signed CA and serving pair, as JSON {"ca.crt","tls.crt","tls.key",
"ca-previous.crt" (base64; empty when there is none), "notAfter",
"dnsNames"}. The Secret and the webhook configurations both need the same
pair, so it is computed once per render and kept on the root context. An
existing Secret (found with lookup) is reused as long as it was made for the
same DNS names and does not expire within certs.selfSigned.renewBeforeDays:
upgrades do not rotate the CA by surprise. When it is replaced, its CA is kept
as ca-previous.crt (until the next rotation) and stays in the caBundle: the
webhook pods serve the old pair until the kubelet has synced the new Secret
into them, and the API server must trust both meanwhile. Offline renders
(helm template, lint) cannot look up and always generate.
*/}}
{{- define "graceguard.selfSignedTLS" -}}
{{- if not (hasKey . "graceguardSelfSignedTLS") }}
{{- $cfg := .Values.certs.selfSigned }}
{{- $dnsNames := include "graceguard.serviceDNSNames" . | fromJsonArray }}
{{- $dnsJoined := join "," $dnsNames }}
{{- $tls := dict }}
{{- $previous := "" }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "graceguard.tlsSecretName" .) }}
{{- if and $existing $existing.data }}
{{- $previous = get $existing.data "ca.crt" }}
{{- end }}
{{- if and $existing $existing.data $existing.metadata.annotations }}
{{- $data := $existing.data }}
{{- $ann := $existing.metadata.annotations }}
{{- $notAfter := get $ann "graceguard.io/not-after" }}
{{- if and (get $data "ca.crt") (get $data "tls.crt") (get $data "tls.key") $notAfter (eq (get $ann "graceguard.io/dns-names") $dnsJoined) }}
{{- $expires := toDate "2006-01-02T15:04:05Z07:00" $notAfter | unixEpoch | atoi }}
{{- $renewAt := sub $expires (mul (int $cfg.renewBeforeDays) 86400) }}
{{- if lt (now | unixEpoch | atoi) $renewAt }}
{{- $tls = dict "ca.crt" (get $data "ca.crt") "tls.crt" (get $data "tls.crt") "tls.key" (get $data "tls.key") "notAfter" $notAfter "ca-previous.crt" (get $data "ca-previous.crt" | default "") }}
{{- end }}
{{- end }}
{{- end }}
{{- if not $tls }}
{{- $days := int $cfg.validityDays }}
{{- $ca := genCA (printf "%s-ca" (include "graceguard.fullname" .)) $days }}
{{- $cert := genSignedCert (first $dnsNames) nil $dnsNames $days $ca }}
{{- $notAfter := dateInZone "2006-01-02T15:04:05Z07:00" (now | dateModify (printf "+%dh" (mul $days 24))) "UTC" }}
{{- $tls = dict "ca.crt" ($ca.Cert | b64enc) "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) "notAfter" $notAfter "ca-previous.crt" $previous }}
{{- end }}
{{- $_ := set $tls "dnsNames" $dnsJoined }}
{{- $_ := set . "graceguardSelfSignedTLS" $tls }}
{{- end }}
{{- get . "graceguardSelfSignedTLS" | toJson }}
{{- end }}

{{/* caBundle for the webhook configurations; empty in certManager mode (injected). */}}
{{- define "graceguard.caBundle" -}}
{{- if eq .Values.certs.mode "selfSigned" }}
{{- $tls := include "graceguard.selfSignedTLS" . | fromJson }}
{{- $previous := get $tls "ca-previous.crt" }}
{{- if $previous }}
{{- printf "%s\n%s\n" (get $tls "ca.crt" | b64dec | trim) ($previous | b64dec | trim) | b64enc }}
{{- else }}
{{- get $tls "ca.crt" }}
{{- end }}
{{- else if eq .Values.certs.mode "existingSecret" }}
{{- if .Values.certs.existingSecret.caBundle }}
{{- .Values.certs.existingSecret.caBundle }}
{{- else }}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "graceguard.tlsSecretName" .) }}
{{- $ca := "" }}
{{- if and $secret $secret.data }}
{{- $ca = get $secret.data "ca.crt" }}
{{- end }}
{{- if not $ca }}
{{- fail (printf "certs.existingSecret.caBundle is empty and Secret %s/%s has no ca.crt (or cannot be read at render time, e.g. helm template): set certs.existingSecret.caBundle to the base64 PEM CA that signed the serving certificate" .Release.Namespace (include "graceguard.tlsSecretName" .)) }}
{{- end }}
{{- $ca }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Annotations of the webhook configurations: webhooks.annotations, and
cert-manager's CA injection in certs.mode certManager (the chart's wins).
*/}}
{{- define "graceguard.webhookAnnotations" -}}
{{- $a := deepCopy (.Values.webhooks.annotations | default dict) -}}
{{- if eq .Values.certs.mode "certManager" -}}
{{- $_ := set $a "cert-manager.io/inject-ca-from" (printf "%s/%s" .Release.Namespace (include "graceguard.certificateName" .)) -}}
{{- end -}}
{{- with $a -}}
{{- toYaml . -}}
{{- end -}}
{{- end }}

{{/*
clientConfig of one webhook. Call with (dict "root" $ "path" "/validate/pods").
*/}}
{{- define "graceguard.webhookClientConfig" -}}
{{- $root := .root -}}
clientConfig:
  service:
    name: {{ include "graceguard.fullname" $root }}
    namespace: {{ $root.Release.Namespace }}
    path: {{ .path }}
    port: {{ $root.Values.service.port }}
  {{- $ca := include "graceguard.caBundle" $root }}
  {{- if $ca }}
  caBundle: {{ $ca }}
  {{- end }}
{{- end }}

{{/*
The namespaces no webhook is sent (JSON list): kube-system and the release
namespace always, then webhooks.excludeNamespaces.
*/}}
{{- define "graceguard.excludedNamespaces" -}}
{{- concat (list "kube-system" .Release.Namespace) (.Values.webhooks.excludeNamespaces | default list) | uniq | toJson -}}
{{- end }}

{{/*
What every webhook skips: kube-system and the release namespace whatever
the values say (a cluster's own system pods, and graceguard's, must never
wait on graceguard, least of all under failurePolicy Fail), the namespaces
in excludeNamespaces and, for the collision guard and the tagger only,
namespaces and pods labelled graceguard.io/ignore=true. The audits (call with
"audit" true) never skip by that label: anyone who may label a pod or a
namespace could otherwise make its deletion unaudited.
webhooks.namespaceSelector and objectSelector add terms (ANDed: they can
narrow what is sent, never widen it). Call with "eviction" true for the
eviction audit: its objectSelector is matched against the Eviction, which
carries no labels, so the user's object terms would switch it off.
*/}}
{{- define "graceguard.webhookSelectors" -}}
{{- $root := .root -}}
{{- $optOut := not (default false .audit) -}}
{{- $excluded := include "graceguard.excludedNamespaces" $root | fromJsonArray -}}
{{- $ns := $root.Values.webhooks.namespaceSelector | default dict -}}
{{- $obj := ternary (dict) ($root.Values.webhooks.objectSelector | default dict) (default false .eviction) -}}
namespaceSelector:
  {{- with $ns.matchLabels }}
  matchLabels:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        {{- toYaml $excluded | nindent 8 }}
    {{- if $optOut }}
    - key: graceguard.io/ignore
      operator: NotIn
      values: ["true"]
    {{- end }}
    {{- with $ns.matchExpressions }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- if or $optOut $obj.matchLabels $obj.matchExpressions }}
objectSelector:
  {{- with $obj.matchLabels }}
  matchLabels:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if or $optOut $obj.matchExpressions }}
  matchExpressions:
    {{- if $optOut }}
    - key: graceguard.io/ignore
      operator: NotIn
      values: ["true"]
    {{- end }}
    {{- with $obj.matchExpressions }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
{{- else }}
objectSelector: {}
{{- end }}
{{- end }}

{{/* A duration of the form N(ms|s|m|h), as whole seconds (rounded up). */}}
{{- define "graceguard.durationSeconds" -}}
{{- $n := regexFind "^[0-9]+" . | int }}
{{- $unit := regexReplaceAll "^[0-9]+" . "" }}
{{- if eq $unit "ms" }}{{ div (add $n 999) 1000 }}
{{- else if eq $unit "s" }}{{ $n }}
{{- else if eq $unit "m" }}{{ mul $n 60 }}
{{- else if eq $unit "h" }}{{ mul $n 3600 }}
{{- else }}{{ fail (printf "%q is not a duration of the form N(ms|s|m|h)" .) }}
{{- end }}
{{- end }}

{{/*
The Kubernetes minors graceguard is tested on, as "oldest newest". The oldest
is Chart.yaml's kubeVersion (>=1.30.0-0: Helm refuses older servers); on a
server newer than the newest, NOTES.txt says it is not yet tested there.
*/}}
{{- define "graceguard.testedKubeVersions" -}}
1.30 1.37
{{- end }}

{{/*
Values earlier releases had, that `helm upgrade --reuse-values` carries
over: accepted by values.schema.json so such an upgrade still renders, and
ignored where they ask for what the chart now always does. A value that asks
for what the chart no longer does fails the render, saying what to do.
  * webhooks.matchConditions (was auto/true/false): matchConditions are now
    always rendered; false fails.
  * rbac.writePolicy (was auto/true/false): the ValidatingAdmissionPolicy now
    always comes with the pods/status grant it confines; false (the grant
    without the policy) fails.
  * webhooks.disruptionTagger.enabled "auto" is read as true (graceguard.taggerOn).
*/}}
{{- define "graceguard.removedValues" -}}
{{- if and (hasKey .Values.webhooks "matchConditions") (eq (toString .Values.webhooks.matchConditions) "false") -}}
{{- fail "webhooks.matchConditions was removed: graceguard needs Kubernetes 1.30+, where matchConditions are GA, and the chart always renders them (the disruption tagger is never registered without its own). Drop the value (helm upgrade --reuse-values: --set webhooks.matchConditions=null)" -}}
{{- end -}}
{{- if and (hasKey .Values.rbac "writePolicy") (eq (toString .Values.rbac.writePolicy) "false") -}}
{{- fail "rbac.writePolicy was removed: the ValidatingAdmissionPolicy that confines graceguard's writes now always comes with the patch on pods/status it confines, never the grant without it. Drop the value (helm upgrade --reuse-values: --set rbac.writePolicy=null); for no grant and no policy, set webhooks.disruptionTagger.followUp=false" -}}
{{- end -}}
{{- end }}

{{/*
Whether the disruption tagger is registered: "true" or empty.
webhooks.disruptionTagger.enabled is a boolean; "auto" (the default before
the chart required Kubernetes 1.30, carried over by `helm upgrade
--reuse-values`) is read as true, and the quoted "true"/"false" those
releases accepted as the booleans they spell. It is always registered with
its matchConditions.
*/}}
{{- define "graceguard.taggerOn" -}}
{{- $mode := toString .Values.webhooks.disruptionTagger.enabled -}}
{{- if or (eq $mode "true") (eq $mode "auto") -}}
true
{{- end -}}
{{- end }}

{{/*
Whether graceguard tags afterwards under its own identity (the follow-up,
which needs RBAC patch on pods/status): "true" or empty. Both the node's and
the Eviction API's follow-ups tag from a DisruptionTarget, so the tagger must
be on.
*/}}
{{- define "graceguard.followUpOn" -}}
{{- if and (include "graceguard.taggerOn" .) .Values.webhooks.disruptionTagger.followUp -}}
true
{{- end -}}
{{- end }}

{{/*
matchConditions of one webhook, from files/match-conditions.yaml; always
rendered (GA from Kubernetes 1.30, the oldest the chart installs on). Call
with (dict "root" $ "hook" "collisionGuard"); a hook without an entry there
(the eviction audit) gets none.
*/}}
{{- define "graceguard.matchConditions" -}}
{{- $root := .root -}}
{{- $all := $root.Files.Get "files/match-conditions.yaml" | fromYaml -}}
{{- with get $all .hook -}}
matchConditions:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end }}

{{/*
The collision guard's kinds other than pods, as a list of dicts
{"group": ..., "resource": ...}, from webhooks.collisionGuard.kinds.
*/}}
{{- define "graceguard.otherKinds" -}}
{{- $out := list -}}
{{- range .Values.webhooks.collisionGuard.kinds -}}
{{- if ne . "pods" -}}
{{- $parts := splitn "." 2 . -}}
{{- $out = append $out (dict "resource" $parts._0 "group" (default "" $parts._1)) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end }}

{{/*
Whether graceguard writes through the API, and so whether the ClusterRole
grants patch on pods/status (clusterrole.yaml) AND the
ValidatingAdmissionPolicy and its binding that confine that grant to
graceguard.io/* labels and annotations are rendered (policy.yaml): "true" or
empty. Both templates test this one helper, so the grant never renders
without the policy. With the follow-up off, or rbac.create false (the chart
grants nothing), neither is rendered.
*/}}
{{- define "graceguard.writes" -}}
{{- if and .Values.rbac.create (include "graceguard.followUpOn" .) -}}
true
{{- end -}}
{{- end }}

{{/* The pods' node selector: Linux nodes (the images hold Linux binaries), and the user's own (which win). */}}
{{- define "graceguard.nodeSelector" -}}
{{- toYaml (merge (dict) (.Values.nodeSelector | default dict) (dict "kubernetes.io/os" "linux")) }}
{{- end }}

{{/* The pods' nodeAffinity: only the architectures the image holds. */}}
{{- define "graceguard.archAffinity" -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      - matchExpressions:
          - key: kubernetes.io/arch
            operator: In
            values:
              {{- range .Values.image.platforms }}
              - {{ trimPrefix "linux/" . | quote }}
              {{- end }}
{{- end }}

{{/*
"true" when the collision guard refuses a guard's Create sent under a Lease
term that is over. Missing (an upgrade with --reuse-values from a release
before the setting) is on, as the default.
*/}}
{{- define "graceguard.fencingOn" -}}
{{- if and .Values.webhooks.collisionGuard.enabled (ne (toString .Values.webhooks.collisionGuard.fencing) "false") -}}
true
{{- end -}}
{{- end -}}
