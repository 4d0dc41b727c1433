"""Render charts/graceguard with the real Helm engine and assert on the parsed
objects: for every ci/*-values.yaml, then for the options those files do not
cover."""

from __future__ import annotations

import base64
import unittest
from typing import Any


import chartlib as cl
from chartlib import NAMESPACE, RELEASE

CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
# Every apiVersion the chart may render, and what serves it.
KNOWN_APIS = {
    "v1", "apps/v1", "policy/v1", "rbac.authorization.k8s.io/v1",
    "admissionregistration.k8s.io/v1", "cert-manager.io/v1", "monitoring.coreos.com/v1", "networking.k8s.io/v1",
}
WEBHOOKS = {
    # values key: (webhook name, kind, path, operation, resource)
    "collisionGuard": ("collision-guard.graceguard.io", "ValidatingWebhookConfiguration", "/validate/pods", "CREATE", "pods"),
    "disruptionTagger": ("disruption-tagger.graceguard.io", "MutatingWebhookConfiguration", "/mutate/pods-status", "UPDATE", "pods/status"),
    "deletionAudit": ("deletion-audit.graceguard.io", "ValidatingWebhookConfiguration", "/validate/pods-delete", "DELETE", "pods"),
    "evictionAudit": ("eviction-audit.graceguard.io", "ValidatingWebhookConfiguration", "/validate/pods-eviction", "CREATE", "pods/eviction"),
}
MATCH_CONDITIONS = cl.yaml_file(cl.CHART_DIR / "files" / "match-conditions.yaml")
# The chart's version and appVersion (one X.Y.Z for app and chart: docs/releasing.md).
CHART_VERSION = cl.yaml_file(cl.CHART_DIR / "Chart.yaml")["version"]
# The supported window: Chart.yaml's kubeVersion (>=1.30.0-0) to the newest tested.
OLDEST, NEWEST = "v1.30.0", "v1.37.2"
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def enabled(wcfg: dict[str, Any], key: str) -> bool:
    """Whether webhook `key` is registered ("auto", which earlier releases
    gave the tagger, is read as true)."""
    return str(wcfg[key]["enabled"]).lower() in ("true", "auto")


def grants_pod_status_patch(r: cl.Rendered) -> bool:
    return any("pods/status" in rule["resources"] and "patch" in rule["verbs"]
               for role in r.of_kind("ClusterRole") for rule in role["rules"])


def write_policy(r: cl.Rendered) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and its binding, in that order, as rendered."""
    return [o for k in POLICY_KINDS for o in r.of_kind(k)]


def match_conditions(r: cl.Rendered) -> dict[str, Any]:
    """{webhook name: its matchConditions (None without)}."""
    return {wh["name"]: wh.get("matchConditions") for cfg in r.webhook_configurations() for wh in cfg["webhooks"]}


def other_kinds(values: dict[str, Any]) -> list[tuple[str, str]]:
    """The collision guard's kinds besides pods, as (group, resource)."""
    cg = values["webhooks"]["collisionGuard"]
    if not cg["enabled"]:
        return []
    out = []
    for kind in cg["kinds"]:
        if kind != "pods":
            resource, _, group = kind.partition(".")
            out.append((group, resource))
    return out
IGNORE_EXPR = {"key": "graceguard.io/ignore", "operator": "NotIn", "values": ["true"]}
# The audits never skip by the opt-out label: labelling a pod or namespace
# must not make its deletion unaudited.
AUDITS = {"deletion-audit.graceguard.io", "eviction-audit.graceguard.io"}


def seconds(duration: str) -> float:
    for unit, mult in (("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)):
        if duration.endswith(unit) and duration[: -len(unit)].isdigit():
            return int(duration[: -len(unit)]) * mult
    raise ValueError(duration)


class PerValuesFile:
    """Checks that hold for every ci values file. Subclassed once per file below."""

    values_file: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.values = cl.load_values(cl.CI_DIR / cls.values_file)
        cls.merged = cl.merge_values(cls.values)
        cls.r = cl.render_objects(cls.values)
        cls.fullname = cls.merged.get("fullnameOverride") or RELEASE

    # -- helpers
    def deployment(self) -> dict[str, Any]:
        return self.r.one("Deployment")

    def pod_spec(self) -> dict[str, Any]:
        return self.deployment()["spec"]["template"]["spec"]

    def container(self) -> dict[str, Any]:
        containers = self.pod_spec()["containers"]
        self.assertEqual(len(containers), 1)
        return containers[0]

    # -- checks
    def test_objects_are_labelled_and_namespaced(self) -> None:
        self.assertTrue(self.r.objects)
        for o in self.r.objects:
            md = o["metadata"]
            what = f"{o['kind']}/{md['name']}"
            labels = md.get("labels") or {}
            self.assertEqual(labels.get("app.kubernetes.io/instance"), RELEASE, what)
            self.assertEqual(labels.get("app.kubernetes.io/name"), "graceguard", what)
            self.assertEqual(labels.get("app.kubernetes.io/managed-by"), "Helm", what)
            self.assertEqual(labels.get("app.kubernetes.io/version"), CHART_VERSION, what)
            self.assertEqual(labels.get("helm.sh/chart"), f"graceguard-{CHART_VERSION}", what)
            if o["kind"] in CLUSTER_SCOPED:
                self.assertNotIn("namespace", md, what)
            elif o["kind"] in ("Role", "RoleBinding"):
                # Only the self-test's, in the namespace it dry-runs a pod in.
                self.assertEqual(md.get("namespace"), self.merged["tests"]["namespace"], what)
                self.assertEqual((md.get("annotations") or {}).get("helm.sh/hook"), "test", what)
            else:
                self.assertEqual(md.get("namespace"), NAMESPACE, what)
            self.assertLessEqual(len(md["name"]), 63 if o["kind"] in ("Service", "Deployment") else 253, what)

    def test_only_known_served_apis(self) -> None:
        for o in self.r.objects:
            self.assertIn(o["apiVersion"], KNOWN_APIS, f"{o['kind']} {o['apiVersion']}")
        # Offline, the cluster serves no ServiceMonitor: none is rendered even when enabled.
        self.assertEqual(self.r.of_kind("ServiceMonitor"), [])
        mode = self.merged["certs"]["mode"]
        cm_kinds = {o["kind"] for o in self.r.objects if o["apiVersion"] == "cert-manager.io/v1"}
        if mode == "certManager":
            self.assertIn("Certificate", cm_kinds)
        else:
            self.assertEqual(cm_kinds, set())

    def test_webhook_configurations(self) -> None:
        wcfg = self.merged["webhooks"]
        rendered_names = {wh["name"] for cfg in self.r.webhook_configurations() for wh in cfg["webhooks"]}
        expected_names = {WEBHOOKS[k][0] for k in WEBHOOKS if wcfg[k]["enabled"]}
        others = other_kinds(self.merged)
        if others:
            expected_names.add("collision-guard-kinds.graceguard.io")
        fencing = enabled(wcfg, "collisionGuard") and wcfg["collisionGuard"].get("fencing", True) is not False
        if fencing:
            expected_names.add("release-fencing.graceguard.io")
        self.assertEqual(rendered_names, expected_names)
        if fencing:
            cfg, wh = self.r.webhook("release-fencing.graceguard.io")
            self.assertEqual(cfg["metadata"]["name"], self.r.webhook("collision-guard.graceguard.io")[0]["metadata"]["name"])
            self.assertEqual((wh["failurePolicy"], wh["sideEffects"]), ("Ignore", "None"))
            self.assertEqual(wh["clientConfig"]["service"]["path"], "/validate/pods-release")
            self.assertEqual(wh["rules"], [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                                            "resources": ["pods"], "scope": "Namespaced"}])
            self.assertEqual(wh["matchConditions"], MATCH_CONDITIONS["releaseFencing"])
        if others:
            cfg, wh = self.r.webhook("collision-guard-kinds.graceguard.io")
            self.assertEqual(cfg["metadata"]["name"], self.r.webhook("collision-guard.graceguard.io")[0]["metadata"]["name"])
            self.assertEqual(wh["failurePolicy"], "Ignore")
            self.assertEqual(wh["clientConfig"]["service"]["path"], "/validate/collision")
            self.assertEqual([(r["apiGroups"], r["resources"], r["operations"]) for r in wh["rules"]],
                             [([g], [res], ["CREATE"]) for g, res in others])
        service = self.r.one("Service")
        https_port = next(p for p in service["spec"]["ports"] if p["name"] == "https")
        excluded = set(wcfg["excludeNamespaces"]) | {NAMESPACE, "kube-system"}
        for key, (name, kind, path, op, resource) in WEBHOOKS.items():
            if not enabled(wcfg, key):
                continue
            cfg, wh = self.r.webhook(name)
            self.assertEqual(cfg["kind"], kind, name)
            extra = int(bool(others)) + int(fencing) if key == "collisionGuard" else 0
            self.assertEqual(len(cfg["webhooks"]), 1 + extra, name)
            self.assertEqual(wh["rules"], [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": [op],
                "resources": [resource], "scope": "Namespaced",
            }], name)
            want_policy = wcfg["collisionGuard"]["failurePolicy"] if key == "collisionGuard" else "Ignore"
            self.assertEqual(wh["failurePolicy"], want_policy, name)
            # Only the follow-up writes, afterwards, and never for a dry run.
            follows_up = enabled(wcfg, "disruptionTagger") and wcfg["disruptionTagger"]["followUp"]
            writes = key in ("disruptionTagger", "evictionAudit") and follows_up
            self.assertEqual(wh["sideEffects"], "NoneOnDryRun" if writes else "None", name)
            self.assertEqual(wh["matchPolicy"], "Equivalent", name)
            want_timeout = wcfg[key]["timeoutSeconds"] if key == "disruptionTagger" else wcfg["timeoutSeconds"]
            self.assertEqual(wh["timeoutSeconds"], want_timeout, name)
            self.assertEqual(wh["admissionReviewVersions"], ["v1"], name)
            if kind == "MutatingWebhookConfiguration":
                self.assertEqual(wh["reinvocationPolicy"], "Never", name)
            svc = wh["clientConfig"]["service"]
            self.assertEqual(svc, {"name": service["metadata"]["name"], "namespace": NAMESPACE,
                                   "path": path, "port": https_port["port"]}, name)
            self.assertNotIn("url", wh["clientConfig"])
            exprs = wh["namespaceSelector"]["matchExpressions"]
            by_name = [e for e in exprs if e["key"] == "kubernetes.io/metadata.name"]
            self.assertEqual(len(by_name), 1, name)
            self.assertEqual(by_name[0]["operator"], "NotIn")
            self.assertEqual(set(by_name[0]["values"]), excluded, name)
            self.assertNotIn("matchLabels", wh["namespaceSelector"])
            if name in AUDITS:
                self.assertNotIn(IGNORE_EXPR, exprs, name)
                self.assertEqual(wh["objectSelector"], {}, name)
            else:
                self.assertIn(IGNORE_EXPR, exprs, name)
                self.assertEqual(wh["objectSelector"], {"matchExpressions": [IGNORE_EXPR]}, name)
            # Always (Kubernetes 1.30+): each webhook's own from files/match-conditions.yaml;
            # the eviction audit has none (every eviction request is audited).
            self.assertEqual(wh.get("matchConditions"), MATCH_CONDITIONS.get(key), name)
        if others:
            _, wh = self.r.webhook("collision-guard-kinds.graceguard.io")
            self.assertEqual(wh["matchConditions"], MATCH_CONDITIONS["collisionGuard"])

    def test_certificates(self) -> None:
        mode = self.merged["certs"]["mode"]
        volumes = {v["name"]: v for v in self.pod_spec()["volumes"]}
        secret_name = volumes["tls"]["secret"]["secretName"]
        self.assertEqual({i["key"] for i in volumes["tls"]["secret"]["items"]}, {"tls.crt", "tls.key"})
        mount = next(m for m in self.container()["volumeMounts"] if m["name"] == "tls")
        self.assertTrue(mount["readOnly"])
        args = self.container()["args"]
        self.assertIn(f"--tls-cert={mount['mountPath']}/tls.crt", args)
        self.assertIn(f"--tls-key={mount['mountPath']}/tls.key", args)
        configs = self.r.webhook_configurations()
        if mode == "selfSigned":
            secret = self.r.one("Secret", secret_name)
            self.assertEqual(secret["type"], "kubernetes.io/tls")
            ca_b64 = secret["data"]["ca.crt"]
            for cfg in configs:
                self.assertNotIn("cert-manager.io/inject-ca-from", (cfg["metadata"].get("annotations") or {}))
                for wh in cfg["webhooks"]:
                    # One CA for the Secret and every webhook (computed once per render).
                    self.assertEqual(wh["clientConfig"].get("caBundle"), ca_b64, wh["name"])
            ca_pem, crt_pem = cl.b64pem(ca_b64), cl.b64pem(secret["data"]["tls.crt"])
            self.assertIn("BEGIN CERTIFICATE", ca_pem)
            self.assertIn("PRIVATE KEY", cl.b64pem(secret["data"]["tls.key"]))
            cl.verify_chain(ca_pem, crt_pem)
            self.assertIn(f"{self.fullname}.{NAMESPACE}.svc", cl.cert_dns_names(crt_pem))
            ann = secret["metadata"]["annotations"]
            self.assertIn("graceguard.io/not-after", ann)
            self.assertIn(f"{self.fullname}.{NAMESPACE}.svc", ann["graceguard.io/dns-names"].split(","))
        elif mode == "certManager":
            serving = [c for c in self.r.of_kind("Certificate") if c["spec"]["secretName"] == secret_name]
            self.assertEqual(len(serving), 1)
            cert = serving[0]
            self.assertIn(f"{self.fullname}.{NAMESPACE}.svc", cert["spec"]["dnsNames"])
            self.assertIn("server auth", cert["spec"]["usages"])
            self.assertEqual(self.r.of_kind("Secret"), [])
            for cfg in configs:
                self.assertEqual(cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
                                 f"{NAMESPACE}/{cert['metadata']['name']}")
                for wh in cfg["webhooks"]:
                    self.assertNotIn("caBundle", wh["clientConfig"], wh["name"])
            ref = cert["spec"]["issuerRef"]
            if self.merged["certs"]["certManager"]["issuerRef"]:
                self.assertEqual(self.r.of_kind("Issuer"), [])
            else:
                # A long-lived CA signs the serving certificate, so the injected
                # caBundle survives the serving certificate's renewals.
                issuer = self.r.one("Issuer", ref["name"])
                ca_secret = issuer["spec"]["ca"]["secretName"]
                ca_cert = next(c for c in self.r.of_kind("Certificate") if c["spec"]["secretName"] == ca_secret)
                self.assertIs(ca_cert["spec"]["isCA"], True)
                self.assertEqual(ca_cert["spec"]["privateKey"]["rotationPolicy"], "Never")
                root = self.r.one("Issuer", ca_cert["spec"]["issuerRef"]["name"])
                self.assertEqual(root["spec"], {"selfSigned": {}})
                self.assertEqual(cert["spec"]["privateKey"]["rotationPolicy"], "Always")
        elif mode == "existingSecret":
            self.assertEqual(secret_name, self.merged["certs"]["existingSecret"]["name"])
            self.assertEqual(self.r.of_kind("Secret"), [])
            want = self.merged["certs"]["existingSecret"]["caBundle"]
            self.assertTrue(want)
            for cfg in configs:
                for wh in cfg["webhooks"]:
                    self.assertEqual(wh["clientConfig"]["caBundle"], want)
        else:
            self.fail(f"unknown certs.mode {mode}")

    def test_rbac_reads_what_it_indexes_and_patches_pod_status_only_for_the_follow_up(self) -> None:
        role = self.r.one("ClusterRole")
        tagger = self.merged["webhooks"]["disruptionTagger"]
        follow_up = enabled(self.merged["webhooks"], "disruptionTagger") and tagger["followUp"]
        read = ("get", "list", "watch")
        want = {("", "pods", read), ("", "namespaces", read)}
        others = other_kinds(self.merged)
        if others:
            want |= {("", "resourcequotas", read)} | {(g, r, read) for g, r in others}
        if follow_up:
            want.add(("", "pods/status", ("patch",)))
        guard = self.merged["webhooks"]["collisionGuard"]
        fencing = enabled(self.merged["webhooks"], "collisionGuard") and guard.get("fencing", True) is not False
        if fencing:
            want.add(("coordination.k8s.io", "leases", ("list", "watch")))
        got = set()
        for rule in role["rules"]:
            self.assertEqual(set(rule), {"apiGroups", "resources", "verbs"})
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    got.add((g, r, tuple(sorted(rule["verbs"]))))
        self.assertEqual(got, want)
        env = {e["name"]: e.get("value") for e in self.pod_spec()["containers"][0]["env"]}
        self.assertEqual(env["GRACEGUARD_FOLLOW_UP_TAGGING"], "true" if follow_up else "false")
        self.assertEqual(env["GRACEGUARD_FENCING"], "true" if fencing else "false")
        # The only Role: the self-test's, during `helm test`.
        self.assertEqual([o for o in self.r.of_kind("Role") + self.r.of_kind("RoleBinding")
                          if o["metadata"]["name"] != f"{self.deployment()['metadata']['name']}-test-self-test"], [])
        binding = self.r.one("ClusterRoleBinding")
        self.assertEqual(binding["roleRef"], {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                              "name": role["metadata"]["name"]})
        sa = self.r.one("ServiceAccount", self.deployment()["spec"]["template"]["spec"]["serviceAccountName"])
        self.assertEqual(binding["subjects"], [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                                "namespace": NAMESPACE}])
        self.assertEqual(self.pod_spec()["serviceAccountName"], sa["metadata"]["name"])
        # The patch never comes without the policy that confines it, nor the policy without it.
        policy = write_policy(self.r)
        self.assertEqual([o["kind"] for o in policy], list(POLICY_KINDS) if follow_up else [])
        if follow_up:
            self.assertEqual(policy[0]["spec"]["matchConditions"][0]["expression"],
                             f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{sa["metadata"]["name"]}"')

    def test_security_context(self) -> None:
        for what, spec in [("deployment", self.pod_spec())] + [(f"helm test pod {p['metadata']['name']}", p["spec"]) for p in self.r.of_kind("Pod")]:
            psc = spec["securityContext"]
            self.assertIs(psc["runAsNonRoot"], True, what)
            self.assertNotEqual(psc.get("runAsUser", 65532), 0, what)
            self.assertEqual(psc["seccompProfile"], {"type": "RuntimeDefault"}, what)
            self.assertFalse(spec.get("hostNetwork", False) or spec.get("hostPID", False) or spec.get("hostIPC", False), what)
            for c in spec["containers"]:
                sc = c["securityContext"]
                self.assertIs(sc["readOnlyRootFilesystem"], True, what)
                self.assertIs(sc["allowPrivilegeEscalation"], False, what)
                self.assertIs(sc["runAsNonRoot"], True, what)
                self.assertIs(sc.get("privileged", False), False, what)
                self.assertEqual(sc["capabilities"], {"drop": ["ALL"]}, what)
                self.assertEqual(sc["seccompProfile"], {"type": "RuntimeDefault"}, what)
                self.assertIn("requests", c["resources"], what)
                self.assertIn("memory", c["resources"]["limits"], what)
        full = self.deployment()["metadata"]["name"]
        # The self-test's only job is an API request.
        self.assertIs(self.r.one("Pod", f"{full}-test-self-test")["spec"]["automountServiceAccountToken"], True)

    def test_pod_disruption_budget_only_with_replicas(self) -> None:
        replicas = self.merged["replicaCount"]
        self.assertEqual(self.deployment()["spec"]["replicas"], replicas)
        pdbs = self.r.of_kind("PodDisruptionBudget")
        if replicas > 1:
            self.assertEqual(len(pdbs), 1)
            pdb = pdbs[0]
            # Always policy/v1 (served since Kubernetes 1.21).
            self.assertEqual(pdb["apiVersion"], "policy/v1")
            self.assertEqual(pdb["spec"]["selector"]["matchLabels"], self.deployment()["spec"]["selector"]["matchLabels"])
            self.assertEqual(len({"minAvailable", "maxUnavailable"} & set(pdb["spec"])), 1)
        else:
            self.assertEqual(pdbs, [])

    def test_deployment_wiring(self) -> None:
        dep = self.deployment()
        selector = dep["spec"]["selector"]["matchLabels"]
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        self.assertLessEqual(selector.items(), pod_labels.items())
        c = self.container()
        args = c["args"]
        self.assertEqual(args[0], "serve")
        cfg = self.merged["config"]
        self.assertEqual(args[1:5], ["--listen=[::]:8443", "--health-listen=[::]:8080",
                                     "--tls-cert=/etc/graceguard/tls/tls.crt", "--tls-key=/etc/graceguard/tls/tls.key"])
        self.assertEqual(args[5:], self.merged["extraArgs"])
        env = {e["name"]: e.get("value") for e in c["env"]}
        want_env = {
            "GRACEGUARD_MODE": cfg["mode"], "GRACEGUARD_CONFIRM_CACHE_TTL": cfg["confirmCacheTTL"],
            "GRACEGUARD_CONFIRM_TIMEOUT": cfg["confirmTimeout"], "GRACEGUARD_LIVELOCK_THRESHOLD": str(cfg["livelockThreshold"]),
            "GRACEGUARD_LIVELOCK_WINDOW": cfg["livelockWindow"], "GRACEGUARD_MAX_BODY_BYTES": str(cfg["maxBodyBytes"]),
            "GRACEGUARD_MAX_CONNECTIONS": str(cfg["maxConnections"]),
            "GRACEGUARD_MAX_CONNECTIONS_PER_CLIENT": str(cfg["maxConnectionsPerClient"]),
            "GRACEGUARD_MAX_IN_FLIGHT": str(cfg["maxInFlight"]), "GRACEGUARD_MAX_BODY_BYTES_IN_FLIGHT": str(cfg["maxBodyBytesInFlight"]),
            "GRACEGUARD_BODY_TIMEOUT": cfg["bodyTimeout"],
            "GRACEGUARD_MAX_IN_FLIGHT_PER_CLIENT": str(cfg["maxInFlightPerClient"]),
            "GRACEGUARD_KIND_PAGE_SIZE": str(cfg["kindPageSize"]),
            "GRACEGUARD_KIND_INDEX_MAX_OBJECTS": str(cfg["kindIndexMaxObjects"]),
            "GRACEGUARD_MAX_BODY_BYTES_IN_FLIGHT_PER_CLIENT": str(cfg["maxBodyBytesInFlightPerClient"]),
            "GRACEGUARD_CERT_RELOAD_INTERVAL": cfg["certReloadInterval"], "GRACEGUARD_SHUTDOWN_GRACE": cfg["shutdownGrace"],
            "GRACEGUARD_SHUTDOWN_DELAY": cfg["shutdownDelay"],
        }
        self.assertEqual({k: env.get(k) for k in want_env}, want_env)
        # The API servers' addresses, when given, pass the per-client caps.
        self.assertEqual(env.get("GRACEGUARD_TRUSTED_PEERS"), ",".join(cfg["trustedPeers"]) or None)
        # Every flag given on the command line is a distinct one (clap refuses repeats).
        flags = [a.split("=", 1)[0] for a in args[1:] if a.startswith("--")]
        self.assertEqual(len(flags), len(set(flags)), args)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        self.assertEqual(ports, {"https": 8443, "http": 8080})
        self.assertEqual(c["livenessProbe"]["httpGet"], {"path": "/healthz", "port": "http"})
        self.assertEqual(c["readinessProbe"]["httpGet"], {"path": "/readyz", "port": "http"})
        spec = self.pod_spec()
        self.assertGreater(spec["terminationGracePeriodSeconds"], seconds(cfg["shutdownDelay"]) + seconds(cfg["shutdownGrace"]))
        self.assertEqual(c["image"], f"localhost/graceguard/graceguard-webhook:{CHART_VERSION}")
        service = self.r.one("Service")
        self.assertEqual(service["spec"]["selector"], selector)
        for p in service["spec"]["ports"]:
            self.assertIn(p["targetPort"], ports)
        self.assertEqual({p["name"] for p in service["spec"]["ports"]}, {"https", "http-metrics"})
        # Linux nodes always; the user's own selector on top (theirs wins).
        self.assertEqual(spec["nodeSelector"], {"kubernetes.io/os": "linux", **(self.merged.get("nodeSelector") or {})})
        if not self.merged.get("affinity"):
            term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            self.assertEqual(term, [{"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": [
                p.removeprefix("linux/") for p in self.merged["image"]["platforms"]]}]}])
        for key in ("tolerations", "imagePullSecrets", "priorityClassName"):
            if self.merged.get(key):
                self.assertEqual(spec[key], self.merged[key], key)
            else:
                self.assertNotIn(key, spec, key)
        for k, v in (self.merged.get("podAnnotations") or {}).items():
            self.assertEqual(dep["spec"]["template"]["metadata"]["annotations"][k], v)
        preset = self.merged["podAntiAffinityPreset"]
        anti = (spec.get("affinity") or {}).get("podAntiAffinity")
        if preset == "none":
            self.assertIsNone(anti)
        elif preset == "soft":
            term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
            self.assertEqual(term["labelSelector"]["matchLabels"], selector)
            self.assertEqual(term["topologyKey"], "kubernetes.io/hostname")
        spread = spec.get("topologySpreadConstraints") or []
        self.assertEqual(len(spread), len(self.merged["topologySpreadConstraints"]))
        for t in spread:
            self.assertEqual(t["labelSelector"]["matchLabels"], selector)

    def test_helm_test_hook(self) -> None:
        hooks = self.r.hooks()
        full = self.deployment()["metadata"]["name"]
        self.assertEqual(sorted((h["kind"], h["metadata"]["name"]) for h in hooks), sorted([
            ("Pod", f"{full}-test-self-test"), ("ServiceAccount", f"{full}-test-self-test"),
            ("Role", f"{full}-test-self-test"), ("RoleBinding", f"{full}-test-self-test")]))
        # The self-test: its own account may create pods in tests.namespace only,
        # the RBAC goes whatever the outcome, and the pod dry-runs a Create there.
        self_test = self.r.one("Pod", f"{full}-test-self-test")
        role = self.r.one("Role", f"{full}-test-self-test")
        self.assertEqual(role["rules"], [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}])
        for o in (role, self.r.one("RoleBinding", f"{full}-test-self-test"), self.r.one("ServiceAccount", f"{full}-test-self-test")):
            self.assertIn("hook-failed", o["metadata"]["annotations"]["helm.sh/hook-delete-policy"])
            self.assertEqual(o["metadata"]["annotations"]["helm.sh/hook-weight"], "-1")
        self.assertEqual(self_test["spec"]["serviceAccountName"], f"{full}-test-self-test")
        self.assertEqual(self_test["spec"]["containers"][0]["args"][:2], ["self-test", f"--namespace={self.merged['tests']['namespace']}"])
        self.assertEqual(self_test["spec"]["containers"][0]["image"], self.container()["image"])
        pod = self_test
        ann = pod["metadata"]["annotations"]
        self.assertEqual(ann["helm.sh/hook"], "test")
        self.assertIn("hook-succeeded", ann["helm.sh/hook-delete-policy"])
        self.assertEqual(pod["spec"]["restartPolicy"], "Never")
        self.assertNotIn("command", pod["spec"]["containers"][0])
        service = self.r.one("Service")
        # The test pod must not become an endpoint of the webhook Service.
        sel = service["spec"]["selector"]
        self.assertFalse(sel.items() <= pod["metadata"]["labels"].items())

    def test_notes(self) -> None:
        self.assertIn(f"helm test {RELEASE} -n {NAMESPACE}", self.r.notes)
        self.assertIn(f"rollout status deployment/{self.deployment()['metadata']['name']}", self.r.notes)


def _per_file_classes() -> None:
    for path in cl.ci_values_files():
        stem = path.name[: -len("-values.yaml")]
        name = f"Test_{stem}_values"
        globals()[name] = type(name, (PerValuesFile, unittest.TestCase), {"values_file": path.name})


_per_file_classes()


class TestDefaults(unittest.TestCase):
    """What `helm install graceguard charts/graceguard` gives without values: the
    safe defaults the chart promises."""

    def test_safe_defaults(self) -> None:
        r = cl.render_objects({})
        self.assertEqual(r.one("Deployment")["spec"]["replicas"], 2)
        self.assertEqual(len(r.of_kind("PodDisruptionBudget")), 1)
        self.assertEqual(len(r.webhook_configurations()), 4)
        for cfg in r.webhook_configurations():
            for wh in cfg["webhooks"]:
                self.assertEqual(wh["failurePolicy"], "Ignore", wh["name"])
                # The tagger only labels: 1 s, it is on the status updates' path.
                want = 1 if wh["name"] == "disruption-tagger.graceguard.io" else 2
                self.assertEqual(wh["timeoutSeconds"], want, wh["name"])
                self.assertIn("kube-system", wh["namespaceSelector"]["matchExpressions"][0]["values"])
                self.assertTrue(wh["clientConfig"]["caBundle"], wh["name"])
        self.assertEqual(r.one("Secret")["type"], "kubernetes.io/tls")
        env = {e["name"]: e.get("value") for e in r.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
        self.assertEqual(env["GRACEGUARD_MODE"], "adaptive")
        self.assertEqual((env["GRACEGUARD_ADAPTIVE_CONFLICTS"], env["GRACEGUARD_MAX_RETRY_AFTER"], env["GRACEGUARD_FINALIZER_RETRY_AFTER"]), ("2", "8s", "5s"))
        self.assertEqual(env["GRACEGUARD_CERT_RELOAD_INTERVAL"], "5s")
        spec = r.one("Deployment")["spec"]["template"]["spec"]
        self.assertIn("preferredDuringSchedulingIgnoredDuringExecution", spec["affinity"]["podAntiAffinity"])
        self.assertEqual(spec["topologySpreadConstraints"][0]["whenUnsatisfiable"], "ScheduleAnyway")
        self.assertEqual(r.of_kind("ServiceMonitor"), [])


class TestOptions(unittest.TestCase):
    """Options the ci files do not show, one render each."""

    def test_priority_class_defaults_to_cluster_critical_with_a_quota_admitting_it(self) -> None:
        def quota(r: cl.Rendered) -> list[dict[str, Any]]:
            return r.of_kind("ResourceQuota")

        r = cl.render_objects({})
        self.assertEqual(r.one("Deployment")["spec"]["template"]["spec"]["priorityClassName"], "system-cluster-critical")
        rq = r.one("ResourceQuota")
        self.assertEqual(rq["metadata"]["namespace"], cl.NAMESPACE)
        self.assertEqual(rq["spec"]["hard"], {"pods": "10"})
        self.assertEqual(rq["spec"]["scopeSelector"]["matchExpressions"],
                         [{"scopeName": "PriorityClass", "operator": "In", "values": ["system-cluster-critical"]}])
        # Another class: no quota unless asked for (it would cap that class's
        # other pods in the namespace); asked for, it follows the class.
        self.assertEqual(quota(cl.render_objects({"priorityClassName": "platform"})), [])
        r = cl.render_objects({"priorityClassName": "platform", "priorityClassQuota": {"enabled": True}})
        self.assertEqual(r.one("ResourceQuota")["spec"]["scopeSelector"]["matchExpressions"][0]["values"], ["platform"])
        r = cl.render_objects({"priorityClassName": "system-node-critical"})
        self.assertEqual(r.one("ResourceQuota")["spec"]["scopeSelector"]["matchExpressions"][0]["values"], ["system-node-critical"])
        r = cl.render_objects({"priorityClassName": ""})
        self.assertNotIn("priorityClassName", r.one("Deployment")["spec"]["template"]["spec"])
        self.assertEqual(quota(r), [])
        self.assertEqual(quota(cl.render_objects({"priorityClassQuota": {"enabled": False}})), [])
        # Never in kube-system, whose own critical pods it would cap.
        self.assertEqual(quota(cl.render_objects({}, namespace="kube-system")), [])
        with self.assertRaisesRegex(cl.HelmError, r"priorityClassQuota.pods \(2\) must exceed replicaCount \(2\)"):
            cl.render_objects({"priorityClassQuota": {"pods": 2}})

    def test_webhook_annotations_and_extra_selector_terms(self) -> None:
        extra_ns = {"key": "team", "operator": "In", "values": ["batch"]}
        extra_obj = {"key": "tier", "operator": "NotIn", "values": ["system"]}
        values = {"webhooks": {
            "annotations": {"example.com/owner": "platform"},
            "namespaceSelector": {"matchLabels": {"env": "prod"}, "matchExpressions": [extra_ns]},
            "objectSelector": {"matchLabels": {"app": "x"}, "matchExpressions": [extra_obj]},
        }}
        for mode in ("selfSigned", "certManager"):
            r = cl.render_objects({**values, "certs": {"mode": mode}})
            configs = r.webhook_configurations()
            self.assertEqual(len(configs), 4)
            for cfg in configs:
                ann = cfg["metadata"]["annotations"]
                self.assertEqual(ann["example.com/owner"], "platform", cfg["metadata"]["name"])
                self.assertEqual("cert-manager.io/inject-ca-from" in ann, mode == "certManager", cfg["metadata"]["name"])
                for wh in cfg["webhooks"]:
                    ns, obj = wh["namespaceSelector"], wh["objectSelector"]
                    # The chart's own terms first, the extra ones ANDed after them.
                    own = 1 if wh["name"] in AUDITS else 2
                    self.assertEqual(ns["matchExpressions"][0]["key"], "kubernetes.io/metadata.name", wh["name"])
                    if own == 2:
                        self.assertEqual(ns["matchExpressions"][1]["key"], "graceguard.io/ignore", wh["name"])
                    self.assertEqual(ns["matchExpressions"][own:], [extra_ns], wh["name"])
                    self.assertEqual(ns["matchLabels"], {"env": "prod"}, wh["name"])
                    if wh["name"] == "eviction-audit.graceguard.io":
                        # Matched against the Eviction, which has no labels:
                        # the user's object terms would switch it off.
                        self.assertEqual(obj, {}, wh["name"])
                        continue
                    obj_own = 0 if wh["name"] in AUDITS else 1
                    if obj_own:
                        self.assertEqual(obj["matchExpressions"][0]["key"], "graceguard.io/ignore", wh["name"])
                    self.assertEqual(obj["matchExpressions"][obj_own:], [extra_obj], wh["name"])
                    self.assertEqual(obj["matchLabels"], {"app": "x"}, wh["name"])
        # Without them: no annotations in selfSigned mode, no matchLabels.
        for cfg in cl.render_objects({}).webhook_configurations():
            self.assertNotIn("annotations", cfg["metadata"])
            for wh in cfg["webhooks"]:
                self.assertNotIn("matchLabels", wh["namespaceSelector"])
                audit = wh["name"] in AUDITS
                self.assertEqual(len(wh["namespaceSelector"]["matchExpressions"]), 1 if audit else 2)
                self.assertEqual(len(wh["objectSelector"].get("matchExpressions", [])), 0 if audit else 1)
        for bad in ({"key": "a", "operator": "Maybe"}, {"key": "a", "operator": "In"}, {"key": "a", "operator": "Exists", "values": ["x"]}):
            with self.subTest(bad=bad), self.assertRaises(cl.HelmValuesError):
                cl.render_objects({"webhooks": {"namespaceSelector": {"matchExpressions": [bad]}}})

    def test_servicemonitor_rendered_only_when_served_and_enabled(self) -> None:
        on = {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}}
        for api in ("monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor"):
            r = cl.render_objects(on, api_versions=[api])
            sm = r.one("ServiceMonitor")
            self.assertEqual(sm["metadata"]["labels"]["release"], "prom")
            self.assertEqual(sm["spec"]["endpoints"][0]["port"], "http-metrics")
            self.assertEqual(sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"], "webhook")
            self.assertNotIn("WARNING", r.notes)
        self.assertEqual(cl.render_objects({}, api_versions=["monitoring.coreos.com/v1"]).of_kind("ServiceMonitor"), [])
        r = cl.render_objects(on)
        self.assertEqual(r.of_kind("ServiceMonitor"), [])
        self.assertIn("does not serve", r.notes)

    def test_refuses_kubernetes_older_than_1_30(self) -> None:
        # Chart.yaml's kubeVersion: Helm itself refuses to template (and so to
        # install or upgrade) for an older server, naming the constraint.
        for kube in ("v1.29.9", "v1.28.0", "v1.20.2"):
            with self.subTest(kube_version=kube), self.assertRaises(cl.HelmError) as ctx:
                cl.render({}, kube_version=kube)
            self.assertIn(">=1.30.0-0", str(ctx.exception))
            self.assertIn(kube, str(ctx.exception))
        # The window's ends render, and so does a provider's pre-release build of 1.30.
        for kube in (OLDEST, NEWEST, "v1.30.0-eks-1234"):
            with self.subTest(kube_version=kube):
                self.assertEqual(len(cl.render_objects({}, kube_version=kube).webhook_configurations()), 4)

    def test_notes_name_the_tested_window_only_past_its_newest(self) -> None:
        for kube in (OLDEST, NEWEST, "v1.37.99"):
            with self.subTest(kube_version=kube):
                notes = cl.render_objects({}, kube_version=kube).notes
                self.assertNotIn("not yet tested", notes)
                # Nothing left of the notes for older servers.
                self.assertNotIn("matchConditions are off", notes)
                self.assertNotIn("kubectl label namespace kube-system", notes)
                self.assertNotIn("disruption tagger is off", notes)
        for kube in ("v1.38.0", "v1.38.0-alpha.1", "v1.40.2-gke.100"):
            with self.subTest(kube_version=kube):
                self.assertIn(f"NOTE: graceguard is not yet tested on Kubernetes {kube}; tested 1.30–1.37.",
                              cl.render_objects({}, kube_version=kube).notes)

    def test_release_namespace_is_excluded(self) -> None:
        r = cl.render_objects({}, namespace="platform")
        for cfg in r.webhook_configurations():
            for wh in cfg["webhooks"]:
                values = wh["namespaceSelector"]["matchExpressions"][0]["values"]
                self.assertEqual(set(values), {"kube-system", "platform"})
                self.assertEqual(wh["clientConfig"]["service"]["namespace"], "platform")

    def test_kube_system_is_excluded_whatever_the_values_say(self) -> None:
        # An override of excludeNamespaces used to drop kube-system: with
        # failurePolicy Fail and no replica up, its system pods were refused.
        for extra in ([], ["monitoring"]):
            r = cl.render_objects({"webhooks": {"excludeNamespaces": extra,
                                                "collisionGuard": {"failurePolicy": "Fail"}}}, namespace="platform")
            for cfg in r.webhook_configurations():
                for wh in cfg["webhooks"]:
                    values = wh["namespaceSelector"]["matchExpressions"][0]["values"]
                    self.assertEqual(set(values), {"kube-system", "platform", *extra}, extra)
            self.assertIn("kube-system", r.notes)

    def test_name_overrides(self) -> None:
        r = cl.render_objects({"fullnameOverride": "gg"})
        self.assertEqual(r.one("Deployment")["metadata"]["name"], "gg")
        self.assertEqual(r.one("Service")["metadata"]["name"], "gg")
        self.assertEqual({c["metadata"]["name"] for c in r.webhook_configurations()},
                         {"gg-collision-guard", "gg-disruption-tagger", "gg-deletion-audit", "gg-eviction-audit"})
        r = cl.render_objects({}, name="prod")
        self.assertEqual(r.one("Deployment")["metadata"]["name"], "prod-graceguard")
        r = cl.render_objects({"nameOverride": "guard"}, name="prod")
        self.assertEqual(r.one("Deployment")["metadata"]["name"], "prod-guard")
        self.assertEqual(r.one("Deployment")["metadata"]["labels"]["app.kubernetes.io/name"], "guard")

    def test_self_signed_pairs_differ_per_render(self) -> None:
        a = cl.render_objects({}).one("Secret")["data"]["ca.crt"]
        b = cl.render_objects({}).one("Secret")["data"]["ca.crt"]
        self.assertNotEqual(a, b, "offline renders cannot look up, so each generates its own CA")

    def test_cert_manager_issuer_ref(self) -> None:
        ref = {"kind": "ClusterIssuer", "name": "corp-ca", "group": "cert-manager.io"}
        r = cl.render_objects({"certs": {"mode": "certManager", "certManager": {"issuerRef": ref}}})
        self.assertEqual(r.of_kind("Issuer"), [])
        self.assertEqual(r.one("Certificate")["spec"]["issuerRef"], ref)

    def test_client_auth_mounts_the_ca_and_passes_the_names_only_when_asked(self) -> None:
        def env_and_volumes(values: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any], list[str]]:
            pod = cl.render_objects(values).one("Deployment")["spec"]["template"]["spec"]
            c = pod["containers"][0]
            env = {e["name"]: e.get("value", "") for e in c["env"]}
            vols = {v["name"]: v for v in pod["volumes"]}
            return env, vols, [m["mountPath"] for m in c["volumeMounts"]]

        env, vols, mounts = env_and_volumes({})
        self.assertNotIn("GRACEGUARD_CLIENT_CA_FILE", env)
        self.assertNotIn("client-ca", vols)
        env, vols, mounts = env_and_volumes(
            {"certs": {"clientAuth": {"caConfigMap": "kube-root-ca.crt",
                                      "names": ["kube-apiserver-admission", "apiserver.example"]}}})
        self.assertEqual(env["GRACEGUARD_CLIENT_CA_FILE"], "/etc/graceguard/client-ca/ca.crt")
        self.assertEqual(env["GRACEGUARD_CLIENT_NAMES"], "kube-apiserver-admission,apiserver.example")
        self.assertEqual(vols["client-ca"]["configMap"],
                         {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]})
        self.assertIn("/etc/graceguard/client-ca", mounts)
        env, _, _ = env_and_volumes({"certs": {"clientAuth": {"caConfigMap": "ca", "caKey": "bundle.pem"}}})
        self.assertNotIn("GRACEGUARD_CLIENT_NAMES", env)
        with self.assertRaises(cl.HelmError):
            cl.render({"certs": {"clientAuth": {"caConfigMap": "ca", "names": ["a,b"]}}})

    def test_existing_secret_without_ca_bundle_fails_clearly(self) -> None:
        with self.assertRaises(cl.HelmError) as ctx:
            cl.render({"certs": {"mode": "existingSecret", "existingSecret": {"name": "mine"}}})
        self.assertIn("certs.existingSecret.caBundle", str(ctx.exception))

    def test_webhook_timeout_must_exceed_the_confirmation_timeout(self) -> None:
        for values in ({"webhooks": {"timeoutSeconds": 1}},
                       {"config": {"confirmTimeout": "2s"}},
                       {"config": {"confirmTimeout": "1500ms"}}):
            with self.assertRaises(cl.HelmError, msg=str(values)) as ctx:
                cl.render(values)
            self.assertIn("must exceed config.confirmTimeout", str(ctx.exception))
        ok = cl.render_objects({"webhooks": {"timeoutSeconds": 5}, "config": {"confirmTimeout": "3s"}})
        self.assertEqual(ok.webhook("collision-guard.graceguard.io")[1]["timeoutSeconds"], 5)

    def test_own_pods_are_labelled_for_self_exclusion_and_have_no_cpu_limit(self) -> None:
        r = cl.render_objects({})
        pod = r.one("Deployment")["spec"]["template"]
        self.assertEqual(pod["metadata"]["labels"]["graceguard.io/ignore"], "true")
        # The guard's and the tagger's objectSelector skip exactly that label;
        # the audits skip graceguard's own pods by their namespace instead.
        for cfg in r.webhook_configurations():
            for wh in cfg["webhooks"]:
                want = {} if wh["name"] in AUDITS else {"matchExpressions": [IGNORE_EXPR]}
                self.assertEqual(wh["objectSelector"], want, wh["name"])
                self.assertIn(NAMESPACE, wh["namespaceSelector"]["matchExpressions"][0]["values"], wh["name"])
        self.assertNotIn("cpu", pod["spec"]["containers"][0]["resources"]["limits"])

    def test_termination_grace_must_exceed_shutdown_grace(self) -> None:
        with self.assertRaises(cl.HelmError) as ctx:
            cl.render({"terminationGracePeriodSeconds": 20})
        self.assertIn("must exceed config.shutdownDelay + config.shutdownGrace", str(ctx.exception))
        with self.assertRaises(cl.HelmError):
            cl.render({"config": {"shutdownDelay": "15s"}})
        with self.assertRaises(cl.HelmError):
            cl.render({"config": {"shutdownGrace": "1m"}})
        dep = cl.render_objects({"config": {"shutdownGrace": "1m"}, "terminationGracePeriodSeconds": 75}).one("Deployment")
        self.assertEqual(dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], 75)

    def test_renew_before_must_be_shorter_than_validity(self) -> None:
        with self.assertRaises(cl.HelmError) as ctx:
            cl.render({"certs": {"selfSigned": {"validityDays": 30, "renewBeforeDays": 30}}})
        self.assertIn("renewBeforeDays", str(ctx.exception))
        secret = cl.render_objects({"certs": {"selfSigned": {"validityDays": 30, "renewBeforeDays": 7}}}).one("Secret")
        end = cl.openssl("x509", "-noout", "-checkend", str(29 * 86400), stdin=cl.b64pem(secret["data"]["tls.crt"]))
        self.assertIn("will not expire", end)
        with self.assertRaises(AssertionError):
            cl.openssl("x509", "-noout", "-checkend", str(31 * 86400), stdin=cl.b64pem(secret["data"]["tls.crt"]))

    def test_pdb_options(self) -> None:
        pdb = cl.render_objects({"podDisruptionBudget": {"maxUnavailable": "50%"}}).one("PodDisruptionBudget")
        self.assertEqual(pdb["spec"]["maxUnavailable"], "50%")
        self.assertNotIn("minAvailable", pdb["spec"])
        self.assertEqual(cl.render_objects({"podDisruptionBudget": {"enabled": False}}).of_kind("PodDisruptionBudget"), [])
        self.assertEqual(cl.render_objects({"replicaCount": 3}).one("PodDisruptionBudget")["spec"]["minAvailable"], 1)

    def test_affinity_presets(self) -> None:
        spec = cl.render_objects({"podAntiAffinityPreset": "hard"}).one("Deployment")["spec"]["template"]["spec"]
        self.assertIn("requiredDuringSchedulingIgnoredDuringExecution", spec["affinity"]["podAntiAffinity"])
        custom = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}}
        spec = cl.render_objects({"affinity": custom}).one("Deployment")["spec"]["template"]["spec"]
        self.assertEqual(spec["affinity"], custom)

    def test_pods_go_to_the_platforms_the_image_holds(self) -> None:
        both = {"image": {"platforms": ["linux/amd64", "linux/arm64"]}}
        for kind, path in (("Deployment", ("spec", "template", "spec")), ("Pod", ("spec",))):
            objs = cl.render_objects(both)
            obj = objs.one("Deployment") if kind == "Deployment" else [h for h in objs.hooks() if h["kind"] == "Pod"][0]
            spec = obj
            for k in path:
                spec = spec[k]
            self.assertEqual(spec["nodeSelector"]["kubernetes.io/os"], "linux", kind)
            term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            self.assertEqual(term["matchExpressions"], [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}], kind)
        # With no podAntiAffinity the arch term stays.
        spec = cl.render_objects({"podAntiAffinityPreset": "none"}).one("Deployment")["spec"]["template"]["spec"]
        self.assertNotIn("podAntiAffinity", spec["affinity"])
        self.assertIn("nodeAffinity", spec["affinity"])

    def test_image_digest_and_tag(self) -> None:
        digest = "sha256:" + "a" * 64
        c = cl.render_objects({"image": {"digest": digest}}).one("Deployment")["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(c["image"], f"localhost/graceguard/graceguard-webhook@{digest}")
        r = cl.render_objects({"image": {"tag": "0.2.0"}})
        self.assertEqual(r.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["image"],
                         "localhost/graceguard/graceguard-webhook:0.2.0")
        for p in r.of_kind("Pod"):
            self.assertEqual(p["spec"]["containers"][0]["image"], "localhost/graceguard/graceguard-webhook:0.2.0")

    def test_max_retry_after_must_be_shorter_than_the_livelock_window(self) -> None:
        with self.assertRaises(cl.HelmError) as ctx:
            cl.render({"config": {"maxRetryAfter": "10s"}})
        self.assertIn("must be shorter than config.livelockWindow", str(ctx.exception))
        ok = cl.render_objects({"config": {"maxRetryAfter": "20s", "livelockWindow": "30s"}})
        env = {e["name"]: e.get("value") for e in ok.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
        self.assertEqual(env["GRACEGUARD_MAX_RETRY_AFTER"], "20s")

    def test_host_network_listens_on_the_node_address(self) -> None:
        r = cl.render_objects({"hostNetwork": True})
        spec = r.one("Deployment")["spec"]["template"]["spec"]
        self.assertIs(spec["hostNetwork"], True)
        self.assertEqual(spec["dnsPolicy"], "ClusterFirstWithHostNet")
        c = spec["containers"][0]
        self.assertIn("--listen=$(GRACEGUARD_POD_IP):8443", c["args"])
        self.assertIn("--health-listen=$(GRACEGUARD_POD_IP):8080", c["args"])
        env = {e["name"]: e for e in c["env"]}
        self.assertEqual(env["GRACEGUARD_POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP")
        off = cl.render_objects({}).one("Deployment")["spec"]["template"]["spec"]
        self.assertNotIn("hostNetwork", off)
        self.assertIn("--listen=[::]:8443", off["containers"][0]["args"])

    def test_self_test_namespace_must_be_covered(self) -> None:
        for ns in ("graceguard", "kube-system"):
            with self.assertRaises(cl.HelmError) as ctx:
                cl.render({"tests": {"namespace": ns}})
            self.assertIn("tests.namespace", str(ctx.exception))
        r = cl.render_objects({"tests": {"namespace": "team-a"}})
        self.assertEqual(r.one("Role")["metadata"]["namespace"], "team-a")
        self.assertEqual(cl.render_objects({"tests": {"selfTest": False}}).of_kind("Role"), [])

    def test_rbac_and_service_account_toggles(self) -> None:
        r = cl.render_objects({"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "platform-sa"}})
        self.assertEqual(r.of_kind("ClusterRole") + r.of_kind("ClusterRoleBinding") + r.of_kind("ServiceAccount"), [])
        self.assertEqual(r.one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"], "platform-sa")

    def test_all_webhooks_can_be_disabled(self) -> None:
        off = {"webhooks": {k: {"enabled": False} for k in WEBHOOKS}}
        r = cl.render_objects(off)
        self.assertEqual(r.webhook_configurations(), [])
        self.assertEqual(r.one("Deployment")["spec"]["replicas"], 2)

    def test_match_conditions_always_and_the_tagger_registered(self) -> None:
        # No version branch left: from the oldest supported server on, every
        # webhook configuration carries matchConditions (the eviction audit's
        # entry is empty by design: every eviction request is audited), and
        # the tagger is registered, with its own.
        for kube in (OLDEST, NEWEST, None):
            with self.subTest(kube_version=kube or "default"):
                r = cl.render_objects({}, kube_version=kube)
                on = match_conditions(r)
                self.assertEqual(set(on), {WEBHOOKS[k][0] for k in WEBHOOKS}
                                 | {"collision-guard-kinds.graceguard.io", "release-fencing.graceguard.io"})
                self.assertEqual(on["release-fencing.graceguard.io"], MATCH_CONDITIONS["releaseFencing"])
                self.assertEqual(on["collision-guard.graceguard.io"], MATCH_CONDITIONS["collisionGuard"])
                self.assertEqual(on["collision-guard-kinds.graceguard.io"], MATCH_CONDITIONS["collisionGuard"])
                self.assertEqual(on["disruption-tagger.graceguard.io"], MATCH_CONDITIONS["disruptionTagger"])
                # A node's final grace-0 delete completes a deletion already audited.
                self.assertEqual(on["deletion-audit.graceguard.io"], MATCH_CONDITIONS["deletionAudit"])
                self.assertIsNone(on["eviction-audit.graceguard.io"])
                self.assertNotIn("evictionAudit", MATCH_CONDITIONS)
                for cfg in r.webhook_configurations():
                    if cfg["metadata"]["name"].endswith("-eviction-audit"):
                        continue
                    for wh in cfg["webhooks"]:
                        self.assertTrue(wh.get("matchConditions"), f"{cfg['metadata']['name']}: {wh['name']}")
                self.assertEqual(r.webhook("disruption-tagger.graceguard.io")[0]["kind"], "MutatingWebhookConfiguration")
                self.assertIn("disruption tagger  MutatingWebhookConfiguration", r.notes)
        # No accepted values render a webhook without its matchConditions or
        # leave the tagger out (short of disruptionTagger.enabled=false): the
        # webhooks.matchConditions values earlier releases took either change
        # nothing or are refused.
        for values in ({"webhooks": {"disruptionTagger": {"enabled": True}}},
                       {"webhooks": {"disruptionTagger": {"enabled": "auto", "followUp": False}}},
                       {"webhooks": {"disruptionTagger": {"enabled": True, "timeoutSeconds": 5}}, "rbac": {"create": False}},
                       *({"webhooks": {"matchConditions": old}} for old in ("auto", True, "true", False, "false")),
                       {"webhooks": {"matchConditions": False, "disruptionTagger": {"enabled": True}}}):
            with self.subTest(values=values):
                try:
                    on = match_conditions(cl.render_objects(values, kube_version=OLDEST))
                except cl.HelmError as e:
                    self.assertIn("webhooks.matchConditions was removed", str(e))
                    continue
                self.assertEqual(on["disruption-tagger.graceguard.io"], MATCH_CONDITIONS["disruptionTagger"])
                for name, conditions in on.items():
                    if name != "eviction-audit.graceguard.io":
                        self.assertTrue(conditions, name)

    def test_removed_match_conditions_value(self) -> None:
        # What `helm upgrade --reuse-values` carries over from an earlier
        # release is accepted: "auto" and true asked for what is now always
        # done; null is how the upgrade notes say to drop a false.
        want = match_conditions(cl.render_objects({}, kube_version=OLDEST))
        for old in ("auto", True, "true", None):
            with self.subTest(value=old):
                got = match_conditions(cl.render_objects({"webhooks": {"matchConditions": old}}, kube_version=OLDEST))
                self.assertEqual(got, want)
        # false asked for no matchConditions (and so no tagger): refused, saying what to do.
        for old in (False, "false"):
            with self.subTest(value=old), self.assertRaises(cl.HelmError) as ctx:
                cl.render({"webhooks": {"matchConditions": old}}, kube_version=OLDEST)
            self.assertIn("webhooks.matchConditions was removed", str(ctx.exception))
            self.assertIn("--set webhooks.matchConditions=null", str(ctx.exception))

    def test_tagger_enabled_is_a_boolean_and_auto_means_true(self) -> None:
        def tagger_and_follow_up(values: dict[str, Any]) -> tuple[Any, str, bool]:
            r = cl.render_objects(values, kube_version=OLDEST)
            hooks = [wh for cfg in r.webhook_configurations() for wh in cfg["webhooks"]
                     if wh["name"] == "disruption-tagger.graceguard.io"]
            env = {e["name"]: e.get("value") for e in
                   r.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
            return (hooks[0] if hooks else None), env["GRACEGUARD_FOLLOW_UP_TAGGING"], grants_pod_status_patch(r)

        self.assertIs(cl.merge_values({})["webhooks"]["disruptionTagger"]["enabled"], True)
        # "auto" is what an earlier release's values carry (helm upgrade --reuse-values).
        for on in ({}, {"enabled": True}, {"enabled": "auto"}, {"enabled": "true"}):
            with self.subTest(tagger=on):
                hook, follow_up, patches = tagger_and_follow_up({"webhooks": {"disruptionTagger": on}})
                self.assertIsNotNone(hook)
                self.assertEqual(hook["timeoutSeconds"], 1)
                self.assertEqual(hook["matchConditions"], MATCH_CONDITIONS["disruptionTagger"])
                self.assertEqual((follow_up, patches), ("true", True))
        for off in ({"enabled": False}, {"enabled": "false"}):
            with self.subTest(tagger=off):
                self.assertEqual(tagger_and_follow_up({"webhooks": {"disruptionTagger": off}}), (None, "false", False))
        with self.assertRaises(cl.HelmValuesError):
            cl.render({"webhooks": {"disruptionTagger": {"enabled": "sometimes"}}})

    def test_previous_release_values_render_the_same_objects(self) -> None:
        # `helm upgrade --reuse-values` reuses the previous release's values,
        # its chart's defaults included: the removed keys at their old defaults.
        previous = {"webhooks": {"matchConditions": "auto", "disruptionTagger": {"enabled": "auto"}},
                    "rbac": {"writePolicy": "auto"}}
        for kube in (OLDEST, NEWEST):
            with self.subTest(kube_version=kube):
                old, new = cl.render_objects(previous, kube_version=kube), cl.render_objects({}, kube_version=kube)
                ident = lambda r: sorted((o["kind"], o["metadata"]["name"]) for o in r.objects)  # noqa: E731
                self.assertEqual(ident(old), ident(new))
                self.assertEqual(match_conditions(old), match_conditions(new))
                self.assertEqual(old.one("ClusterRole")["rules"], new.one("ClusterRole")["rules"])
                self.assertEqual([o["spec"] for o in write_policy(old)], [o["spec"] for o in write_policy(new)])

    def test_fencing_off_drops_the_lease_grant_and_the_release_check(self) -> None:
        r = cl.render_objects({"webhooks": {"collisionGuard": {"fencing": False}}})
        role = r.one("ClusterRole")
        self.assertFalse([rule for rule in role["rules"] if "leases" in rule["resources"]], role)
        names = {wh["name"] for cfg in r.webhook_configurations() for wh in cfg["webhooks"]}
        self.assertNotIn("release-fencing.graceguard.io", names)
        env = {e["name"]: e.get("value") for e in r.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
        self.assertEqual(env["GRACEGUARD_FENCING"], "false")
        # Missing (an upgrade with --reuse-values from before the setting): on.
        r = cl.render_objects({"webhooks": {"collisionGuard": {"fencing": None}}})
        names = {wh["name"] for cfg in r.webhook_configurations() for wh in cfg["webhooks"]}
        self.assertIn("release-fencing.graceguard.io", names)

    def test_follow_up_off_keeps_rbac_read_only(self) -> None:
        r = cl.render_objects({"webhooks": {"disruptionTagger": {"enabled": True, "followUp": False}}})
        role = r.one("ClusterRole")
        self.assertTrue(all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in role["rules"]), role)
        # Nothing written, nothing to confine.
        self.assertEqual(write_policy(r), [])
        self.assertIn("left untagged (disruptionTagger.followUp is false)", r.notes)

    def test_write_policy_comes_with_the_pod_status_grant(self) -> None:
        # Offline, with no --api-versions and at the oldest supported server:
        # no Capabilities check is left.
        r = cl.render_objects({}, kube_version=OLDEST)
        self.assertTrue(grants_pod_status_patch(r))
        policy = write_policy(r)
        self.assertEqual([o["kind"] for o in policy], list(POLICY_KINDS))
        p, binding = policy
        self.assertEqual(p["apiVersion"], "admissionregistration.k8s.io/v1")
        self.assertEqual(binding["apiVersion"], "admissionregistration.k8s.io/v1")
        self.assertEqual(binding["spec"], {"policyName": p["metadata"]["name"], "validationActions": ["Deny"]})
        sa = r.one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
        self.assertEqual(p["spec"]["matchConditions"][0]["expression"],
                         f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{sa}"')
        rules = p["spec"]["matchConstraints"]["resourceRules"]
        self.assertEqual(rules, [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                                  "resources": ["pods", "pods/status"]}])
        self.assertEqual(p["spec"]["failurePolicy"], "Fail")

    def test_pod_status_grant_never_renders_without_the_write_policy(self) -> None:
        # Every combination of what decides whether graceguard writes, plus
        # the rbac.writePolicy values an earlier release's values carry over:
        # the patch on pods/status is rendered exactly when the policy and its
        # binding are, and only when the chart grants it for the follow-up.
        cases = []
        for tagger in (True, False, "auto"):
            for follow_up in (True, False):
                for create in (True, False):
                    cases.append(({"webhooks": {"disruptionTagger": {"enabled": tagger, "followUp": follow_up}},
                                   "rbac": {"create": create}}, OLDEST))
        for old in ("auto", True, "true", None):
            for follow_up in (True, False):
                cases.append(({"webhooks": {"disruptionTagger": {"followUp": follow_up}}, "rbac": {"writePolicy": old}}, NEWEST))
        cases.append(({"serviceAccount": {"create": False, "name": "platform-sa"}}, NEWEST))
        cases.append(({"serviceAccount": {"create": False, "name": "platform-sa"}, "rbac": {"create": False}}, NEWEST))
        granted = 0
        for values, kube in cases:
            with self.subTest(values=values, kube_version=kube):
                r = cl.render_objects(values, kube_version=kube)
                merged = cl.merge_values(values)
                tagger = merged["webhooks"]["disruptionTagger"]
                writes = (merged["rbac"]["create"] and str(tagger["enabled"]).lower() in ("true", "auto")
                          and tagger["followUp"])
                self.assertEqual(grants_pod_status_patch(r), writes)
                policy = write_policy(r)
                self.assertEqual([o["kind"] for o in policy], list(POLICY_KINDS) if writes else [])
                if writes:
                    granted += 1
                    sa = r.one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
                    self.assertEqual([s["name"] for s in r.one("ClusterRoleBinding")["subjects"]], [sa])
                    self.assertIn(f":{sa}\"", policy[0]["spec"]["matchConditions"][0]["expression"])
                    self.assertEqual(policy[1]["spec"]["policyName"], policy[0]["metadata"]["name"])
        self.assertGreater(granted, 3)
        # rbac.writePolicy=false asked for the grant without the policy: refused.
        for old in (False, "false"):
            with self.subTest(writePolicy=old), self.assertRaises(cl.HelmError) as ctx:
                cl.render({"rbac": {"writePolicy": old}})
            self.assertIn("rbac.writePolicy was removed", str(ctx.exception))
            self.assertIn("webhooks.disruptionTagger.followUp=false", str(ctx.exception))

    def test_notes_say_how_each_disruption_source_is_tagged(self) -> None:
        notes = cl.render_objects({}).notes
        for source in ("PreemptionByScheduler", "TerminationByKubelet", "EvictionByEvictionAPI", "DeletionByPodGC"):
            self.assertIn(source, notes)
        self.assertIn("never in the node's request", notes)

    def test_collision_kinds_drive_rules_rbac_and_the_flag(self) -> None:
        r = cl.render_objects({"webhooks": {"collisionGuard": {"enabled": True, "failurePolicy": "Fail",
                                                               "kinds": ["persistentvolumeclaims", "widgets.example.com"]}}})
        names = {wh["name"] for cfg in r.webhook_configurations() for wh in cfg["webhooks"]}
        self.assertNotIn("collision-guard.graceguard.io", names, "pods left out of kinds")
        _, wh = r.webhook("collision-guard-kinds.graceguard.io")
        self.assertEqual(wh["failurePolicy"], "Ignore", "only pods may use Fail")
        self.assertEqual([(x["apiGroups"], x["resources"]) for x in wh["rules"]],
                         [([""], ["persistentvolumeclaims"]), (["example.com"], ["widgets"])])
        env = {e["name"]: e.get("value") for e in r.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
        self.assertEqual(env["GRACEGUARD_COLLISION_KINDS"], "persistentvolumeclaims,widgets.example.com")
        rules = r.one("ClusterRole")["rules"]
        self.assertIn({"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get", "list", "watch"]}, rules)
        only_pods = cl.render_objects({"webhooks": {"collisionGuard": {"enabled": True, "failurePolicy": "Ignore", "kinds": ["pods"]}}})
        env = {e["name"]: e.get("value") for e in only_pods.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
        self.assertEqual(env["GRACEGUARD_COLLISION_KINDS"], "")
        self.assertNotIn("resourcequotas", str(only_pods.one("ClusterRole")["rules"]))

    def test_network_policy_is_opt_in_and_egress_needs_the_api_server(self) -> None:
        self.assertEqual(cl.render_objects({}).of_kind("NetworkPolicy"), [])
        prom = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
        r = cl.render_objects({"networkPolicy": {"enabled": True, "metricsFrom": prom}})
        np = r.one("NetworkPolicy")
        dep = r.one("Deployment")
        self.assertEqual(np["spec"]["podSelector"]["matchLabels"], dep["spec"]["selector"]["matchLabels"])
        self.assertEqual(np["spec"]["policyTypes"], ["Ingress"])
        webhook, metrics = np["spec"]["ingress"]
        self.assertEqual(webhook["ports"], [{"port": 8443, "protocol": "TCP"}])
        self.assertNotIn("from", webhook, "the API server may call from anywhere unless told")
        self.assertEqual(metrics["from"], prom)
        with self.assertRaises(cl.HelmError) as ctx:
            cl.render({"networkPolicy": {"enabled": True, "egress": {"enabled": True, "apiServerCIDRs": [], "apiServerPorts": [443]}}})
        self.assertIn("needs networkPolicy.egress.apiServerCIDRs", str(ctx.exception))
        r = cl.render_objects({"networkPolicy": {"enabled": True, "egress": {"enabled": True, "apiServerCIDRs": ["10.0.0.10/32"], "apiServerPorts": [6443]}}})
        np = r.one("NetworkPolicy")
        self.assertEqual(np["spec"]["policyTypes"], ["Ingress", "Egress"])
        self.assertEqual(np["spec"]["egress"][0], {"to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}], "ports": [{"port": 6443, "protocol": "TCP"}]})

    def test_readiness_ignores_watch_errors_only_under_fail(self) -> None:
        def env(values: dict[str, Any]) -> dict[str, Any]:
            c = cl.render_objects(values).one("Deployment")["spec"]["template"]["spec"]["containers"][0]
            return {e["name"]: e.get("value") for e in c["env"]}
        self.assertEqual(env({})["GRACEGUARD_READINESS_TRACKS_WATCH"], "true")
        fail = {"webhooks": {"collisionGuard": {"enabled": True, "failurePolicy": "Fail",
                                                "kinds": ["pods"]}}}
        self.assertEqual(env(fail)["GRACEGUARD_READINESS_TRACKS_WATCH"], "false")

    def test_extra_env(self) -> None:
        env = [{"name": "RUST_LOG", "value": "debug"}]
        c = cl.render_objects({"extraEnv": env}).one("Deployment")["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(c["env"][-1], env[0])


if __name__ == "__main__":
    unittest.main()
