"""The chart's monitoring, checked with Prometheus's own promtool
($GRACEGUARD_PROMTOOL; scripts/install-promtool installs it from Debian's
`prometheus` package):

* the PrometheusRule (metrics.prometheusRule): rendered only when enabled and
  served; its spec passes `promtool check rules`; the unit tests in promtool/
  pass `promtool test rules` against the render of their values, every alert
  of the default render fires in one of them and stays silent on the healthy
  series; the values (failure policy, disabled, additionalLabels, selectors,
  thresholds) change what they should;
* the Grafana dashboard (metrics.grafanaDashboard): its ConfigMap, its JSON,
  a datasource on every panel, every query valid PromQL (Grafana's variables
  substituted, each query a recording rule `promtool check rules` accepts),
  every variable a query uses defined;
* every graceguard series the rules and the dashboard read is one that
  the webhook (each owner's registration under webhook/src) or
  guard/src/sidecar/metrics.rs exports.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path
from typing import Any

import yaml

import chartlib as cl
from chartlib import NAMESPACE, RELEASE

HERE = Path(__file__).resolve().parent
PROMTOOL_TESTS_DIR = HERE / "promtool"
MONITORING_API = "monitoring.coreos.com/v1"
RULE_ENABLED: dict[str, Any] = {"metrics": {"prometheusRule": {"enabled": True}}}
GROUPS = ["graceguard-webhook", "graceguard-apiserver", "graceguard-sidecar"]
SEVERITIES = {"critical", "warning", "info"}

# The promtool/ unit-test files and the values each is written for (on top of
# metrics.prometheusRule.enabled). custom-values.yaml's header repeats these.
CUSTOM_VALUES: dict[str, Any] = {
    "metrics": {"prometheusRule": {
        "webhookSelector": 'job="gg-webhook", cluster="prod"',
        "sidecarSelector": 'job=~".+/graceguard-sidecar"',
        "apiServerSelector": 'job="kube-apiserver"',
        "additionalLabels": {"team": "platform", "page": "no"},
        "certificateExpiryDays": 30,
        "unacknowledgedResultSeconds": 300,
        "disabled": ["GraceguardLivelockStorm"],
    }},
    "webhooks": {"timeoutSeconds": 10},
}
PROMTOOL_TESTS: dict[str, dict[str, Any]] = {
    "default.yaml": {},
    "failure-policy-fail.yaml": {"webhooks": {"collisionGuard": {"failurePolicy": "Fail"}}},
    "custom-values.yaml": CUSTOM_VALUES,
}

# Grafana's built-in variables a query may use, and what stands in for them.
GRAFANA_BUILTINS = {"__rate_interval": "2m", "__interval": "30s", "__range": "6h", "__range_s": "21600",
                    "__interval_ms": "30000", "__range_ms": "21600000"}
# Plausible values of the dashboard's own variables (any other gets "x").
VARIABLE_SAMPLES = {"namespace": "graceguard", "job": "graceguard", "sidecar_namespace": "airflow"}
_VAR = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]")

# Series the rules read that graceguard does not export.
NOT_GRACEGUARD = {
    "up",  # Prometheus's own, per scrape target
    # The API server's (k8s.io/apiserver/pkg/admission/metrics)
    "apiserver_admission_webhook_fail_open_count",
    "apiserver_admission_webhook_rejection_count",
    "apiserver_admission_webhook_admission_duration_seconds_bucket",
}


# ---------------------------------------------------------------- promtool

def promtool_bin() -> str:
    path = os.environ.get("GRACEGUARD_PROMTOOL", "")
    if not path or not os.access(path, os.X_OK):
        raise AssertionError(
            f"GRACEGUARD_PROMTOOL does not name promtool ({path!r}): run through scripts/test, or "
            "export GRACEGUARD_PROMTOOL=$(scripts/install-promtool --json | jq -r .promtool)")
    return path


def promtool(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([promtool_bin(), *args], capture_output=True, text=True, cwd=cwd)


def check_rules(groups: dict[str, Any], what: str) -> None:
    """`promtool check rules` (every lint fatal) on a rule file of `groups`."""
    with tempfile.TemporaryDirectory(prefix="graceguard-chart-tests-promtool-") as d:
        path = os.path.join(d, "rules.yaml")
        Path(path).write_text(yaml.safe_dump(groups, sort_keys=False))
        res = promtool("check", "rules", "--lint=all", "--lint-fatal", path)
        if res.returncode != 0:
            raise AssertionError(f"promtool check rules refused {what}:\n{res.stdout}{res.stderr}\n--- rules:\n"
                                 f"{Path(path).read_text()}")


# ---------------------------------------------------------------- renders

_renders: dict[str, cl.Rendered] = {}


def rendered(values: dict[str, Any], api_versions: tuple[str, ...] = (MONITORING_API,)) -> cl.Rendered:
    key = json.dumps([values, api_versions], sort_keys=True)
    if key not in _renders:
        _renders[key] = cl.render_objects(values, api_versions=list(api_versions))
    return _renders[key]


def with_rule(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with metrics.prometheusRule.enabled set."""
    out = copy.deepcopy(values)
    out.setdefault("metrics", {}).setdefault("prometheusRule", {})["enabled"] = True
    return out


def prometheus_rule(values: dict[str, Any]) -> dict[str, Any]:
    return rendered(with_rule(values)).one("PrometheusRule")


def rules_of(rule: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


def alert_names(rule: dict[str, Any]) -> set[str]:
    return {r["alert"] for r in rules_of(rule)}


def by_alert(rule: dict[str, Any], name: str) -> list[dict[str, Any]]:
    found = [r for r in rules_of(rule) if r["alert"] == name]
    if not found:
        raise AssertionError(f"no alert {name} in the render")
    return found


def group(rule: dict[str, Any], name: str) -> list[dict[str, Any]]:
    for g in rule["spec"]["groups"]:
        if g["name"] == name:
            return g["rules"]
    raise AssertionError(f"no group {name}")


def dashboard_configmap(values: dict[str, Any]) -> dict[str, Any]:
    v = copy.deepcopy(values)
    v.setdefault("metrics", {}).setdefault("grafanaDashboard", {})["enabled"] = True
    r = rendered(v, ())
    found = [o for o in r.of_kind("ConfigMap") if o["metadata"]["name"] == f"{RELEASE}-dashboard"]
    if len(found) != 1:
        raise AssertionError(f"expected one ConfigMap {RELEASE}-dashboard, found {len(found)}")
    return found[0]


def dashboard() -> dict[str, Any]:
    cm = dashboard_configmap({})
    return json.loads(cm["data"]["graceguard.json"])


# ---------------------------------------------------------------- PromQL text

def series_names(expr: str) -> set[str]:
    """The metric names of the vector selectors in `expr` (every one is
    written name{...})."""
    return set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{", expr))


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows' nested panels included (rows themselves too)."""
    out: list[dict[str, Any]] = []

    def walk(ps: list[dict[str, Any]]) -> None:
        for p in ps:
            out.append(p)
            walk(p.get("panels") or [])
    walk(dash.get("panels") or [])
    return out


def _var_name(m: re.Match) -> str | None:
    """The variable `m` names; None for `$1` and the like (label_replace's
    capture groups, which Grafana leaves alone as no variable has that name)."""
    name = next(g for g in m.groups() if g)
    return None if name.isdigit() else name


def variables_used(text: str) -> set[str]:
    return {n for n in map(_var_name, _VAR.finditer(text)) if n}


def substitute(expr: str) -> str:
    """`expr` with Grafana's variables replaced by plausible values."""
    def repl(m: re.Match) -> str:
        name = _var_name(m)
        if name is None:
            return m.group(0)
        return GRAFANA_BUILTINS.get(name) or VARIABLE_SAMPLES.get(name, "x")
    return _VAR.sub(repl, expr)


# ---------------------------------------------------------------- what graceguard exports

def exported_series() -> set[str]:
    """The series names graceguard's /metrics serve (webhook and sidecar),
    read from the sources: `registry.register("name", ...)` under the
    "graceguard" prefix; counters get _total, histograms _bucket/_sum/_count,
    infos _info (prometheus-client's OpenMetrics encoding)."""
    out: set[str] = set()
    for rel in ("webhook/src/metrics.rs", "guard/src/sidecar/metrics.rs"):
        if 'Registry::with_prefix("graceguard")' not in (cl.REPO_ROOT / rel).read_text():
            raise AssertionError(f"{rel} no longer registers under the graceguard prefix: update test_monitoring.py")
    # The webhook's owners register their own series (webhook/src/metrics.rs
    # composes them), so every source file of it is read; the sidecar's are
    # in its metrics.rs.
    sources = sorted((cl.REPO_ROOT / "webhook/src").rglob("*.rs")) + [cl.REPO_ROOT / "guard/src/sidecar/metrics.rs"]
    registrations = 0
    for path in sources:
        src = path.read_text()
        fields = dict(re.findall(r"pub (\w+): ([^\n]+),\n", src))
        found = re.findall(r'\.register\(\s*"(\w+)",\s*"(?:[^"\\]|\\.)*",\s*(.*?)\);', src, flags=re.S)
        registrations += len(found)
        for name, arg in found:
            m = re.fullmatch(r"\s*m\.(\w+)\.clone\(\),?\s*", arg)
            kind = fields.get(m.group(1), "") if m else arg
            base = f"graceguard_{name}"
            if "build_info" in kind or "Info" in kind:
                out.add(base + "_info")
            elif "Histogram" in kind:
                out |= {base + "_bucket", base + "_sum", base + "_count"}
            elif "Counter" in kind:
                out.add(base + "_total")
            else:
                out.add(base)
    if registrations < 10:
        raise AssertionError(f"found {registrations} metric registrations in webhook/src and the sidecar: update test_monitoring.py's parser")
    return out


# ================================================================ the rules

class TestPrometheusRuleRender(unittest.TestCase):
    def test_rendered_only_when_enabled_and_served(self) -> None:
        self.assertEqual(rendered(RULE_ENABLED, ()).of_kind("PrometheusRule"), [])
        self.assertEqual(rendered({}, (MONITORING_API,)).of_kind("PrometheusRule"), [])
        # Either form of --api-versions (group/version, group/version/Kind) turns it on.
        for api in (MONITORING_API, f"{MONITORING_API}/PrometheusRule"):
            with self.subTest(api=api):
                self.assertEqual(len(rendered(RULE_ENABLED, (api,)).of_kind("PrometheusRule")), 1)
        self.assertEqual(rendered(RULE_ENABLED, ("monitoring.coreos.com/v1alpha1",)).of_kind("PrometheusRule"), [])

    def test_metadata(self) -> None:
        rule = prometheus_rule({"metrics": {"prometheusRule": {"labels": {"release": "kube-prometheus-stack"}}}})
        md = rule["metadata"]
        self.assertEqual(rule["apiVersion"], MONITORING_API)
        self.assertEqual((md["name"], md["namespace"]), (RELEASE, NAMESPACE))
        self.assertEqual(md["labels"]["release"], "kube-prometheus-stack")
        self.assertEqual(md["labels"]["app.kubernetes.io/instance"], RELEASE)
        self.assertNotIn("release", prometheus_rule({})["metadata"]["labels"])

    def test_groups_and_rules_are_well_formed(self) -> None:
        rule = prometheus_rule({})
        self.assertEqual([g["name"] for g in rule["spec"]["groups"]], GROUPS)
        for r in rules_of(rule):
            with self.subTest(alert=r["alert"]):
                self.assertRegex(r["alert"], r"^Graceguard[A-Za-z]+$")
                self.assertEqual(set(r) - {"for"}, {"alert", "expr", "labels", "annotations"})
                self.assertIn(r["labels"]["severity"], SEVERITIES)
                self.assertEqual(set(r["annotations"]), {"summary", "description"})
                self.assertTrue(r["annotations"]["summary"].strip() and r["annotations"]["description"].strip())
                if "for" in r:
                    self.assertRegex(r["for"], r"^[1-9][0-9]*[smh]$")
        # The two certificate alerts share a name and differ in severity.
        self.assertEqual(sorted(r["labels"]["severity"] for r in by_alert(rule, "GraceguardCertificateExpiresSoon")),
                         ["critical", "warning"])

    def test_promtool_check_rules(self) -> None:
        cases = {
            "defaults": {},
            "failurePolicy Fail": PROMTOOL_TESTS["failure-policy-fail.yaml"],
            "custom values": CUSTOM_VALUES,
            "no API server selector": {"metrics": {"prometheusRule": {"apiServerSelector": ""}}},
            "a whole group disabled": {"metrics": {"prometheusRule": {"disabled": [
                "GraceguardAdmissionFailingOpen", "GraceguardAdmissionCallsRejected",
                "GraceguardAdmissionCallLatencyNearTimeout"]}}},
            "other release and namespace": {"fullnameOverride": "gg"},
        }
        for what, values in cases.items():
            with self.subTest(what):
                check_rules(prometheus_rule(values)["spec"], f"the PrometheusRule rendered with {what}")

    def test_failure_policy_sets_the_severity(self) -> None:
        ignore = prometheus_rule({})
        fail = prometheus_rule(PROMTOOL_TESTS["failure-policy-fail.yaml"])
        self.assertEqual(by_alert(ignore, "GraceguardWebhookDown")[0]["labels"]["severity"], "warning")
        self.assertEqual(by_alert(fail, "GraceguardWebhookDown")[0]["labels"]["severity"], "critical")
        # Failing open is a warning under both: under Fail only the webhooks
        # that always use Ignore can fail open (the refusals alert apart).
        for rule in (ignore, fail):
            self.assertEqual(by_alert(rule, "GraceguardAdmissionFailingOpen")[0]["labels"]["severity"], "warning")
        self.assertIn("failurePolicy Ignore", by_alert(ignore, "GraceguardWebhookDown")[0]["annotations"]["description"])
        self.assertIn("refused", by_alert(fail, "GraceguardWebhookDown")[0]["annotations"]["description"])
        # Everything else is the same.
        strip = {"GraceguardWebhookDown", "GraceguardAdmissionFailingOpen"}
        self.assertEqual([r for r in rules_of(ignore) if r["alert"] not in strip],
                         [r for r in rules_of(fail) if r["alert"] not in strip])

    def test_disabled_alerts_are_left_out(self) -> None:
        every = alert_names(prometheus_rule({}))
        off = ["GraceguardLivelockStorm", "GraceguardCertificateExpiresSoon", "GraceguardSidecarTransitionsDropped"]
        rule = prometheus_rule({"metrics": {"prometheusRule": {"disabled": off}}})
        self.assertEqual(alert_names(rule), every - set(off))
        self.assertEqual(len(rules_of(rule)), len(rules_of(prometheus_rule({}))) - 4)
        # A group left without alerts is left out.
        api = ["GraceguardAdmissionFailingOpen", "GraceguardAdmissionCallsRejected",
               "GraceguardAdmissionCallLatencyNearTimeout"]
        rule = prometheus_rule({"metrics": {"prometheusRule": {"disabled": api}}})
        self.assertEqual([g["name"] for g in rule["spec"]["groups"]], ["graceguard-webhook", "graceguard-sidecar"])
        # A name that is no alert is refused, not ignored.
        with self.assertRaises(cl.HelmError) as ctx:
            cl.render(with_rule({"metrics": {"prometheusRule": {"disabled": ["GraceguardWebhookDwn"]}}}),
                      api_versions=[MONITORING_API])
        self.assertIn("GraceguardWebhookDwn", str(ctx.exception))
        with self.assertRaises(cl.HelmValuesError):
            cl.validate_schema({"metrics": {"prometheusRule": {"disabled": ["webhook-down"]}}})

    def test_additional_labels_on_every_alert(self) -> None:
        rule = prometheus_rule(CUSTOM_VALUES)
        for r in rules_of(rule):
            with self.subTest(alert=r["alert"]):
                self.assertEqual(r["labels"], {"severity": r["labels"]["severity"], "team": "platform", "page": "no"})
        for r in rules_of(prometheus_rule({})):
            self.assertEqual(set(r["labels"]), {"severity"}, r["alert"])

    def test_selectors(self) -> None:
        default = prometheus_rule({})
        wh_default = f'namespace="{NAMESPACE}", job="{RELEASE}"'
        for r in group(default, "graceguard-webhook"):
            self.assertIn(wh_default, r["expr"], r["alert"])
        for r in group(default, "graceguard-apiserver"):
            self.assertIn('{job="apiserver", name', r["expr"], r["alert"])
        for r in group(default, "graceguard-sidecar"):
            self.assertRegex(r["expr"], r"graceguard_sidecar_\w+\{\}", r["alert"])
        # The job follows the fullname (the ServiceMonitor's Service).
        self.assertIn('namespace="graceguard", job="gg"',
                      by_alert(prometheus_rule({"fullnameOverride": "gg"}), "GraceguardWebhookDown")[0]["expr"])

        custom = prometheus_rule(CUSTOM_VALUES)
        sel = CUSTOM_VALUES["metrics"]["prometheusRule"]
        for name, key in (("graceguard-webhook", "webhookSelector"), ("graceguard-apiserver", "apiServerSelector"),
                          ("graceguard-sidecar", "sidecarSelector")):
            for r in group(custom, name):
                with self.subTest(group=name, alert=r["alert"]):
                    self.assertTrue(series_names(r["expr"]))
                    self.assertEqual(r["expr"].count("{" + sel[key]), r["expr"].count("{"),
                                     f"every selector of {r['alert']} starts with {sel[key]}")
                    self.assertNotIn(wh_default, r["expr"])
                    self.assertNotIn('job="apiserver"', r["expr"])
        none = prometheus_rule({"metrics": {"prometheusRule": {"apiServerSelector": ""}}})
        for r in group(none, "graceguard-apiserver"):
            self.assertNotIn("{,", r["expr"])
            self.assertIn('_bucket{name' if "duration" in r["expr"] else '_count{name', r["expr"])

    def test_thresholds(self) -> None:
        default = prometheus_rule({})
        custom = prometheus_rule(CUSTOM_VALUES)
        for rule, days in ((default, 14), (custom, 30)):
            warn = [r for r in by_alert(rule, "GraceguardCertificateExpiresSoon") if r["labels"]["severity"] == "warning"]
            self.assertEqual(len(warn), 1)
            self.assertIn(f"< {days} * 86400", warn[0]["expr"])
            self.assertIn(f"within {days} days", warn[0]["annotations"]["summary"])
        crit = [r for r in by_alert(custom, "GraceguardCertificateExpiresSoon") if r["labels"]["severity"] == "critical"]
        self.assertIn("< 2 * 86400", crit[0]["expr"])
        self.assertTrue(by_alert(default, "GraceguardSidecarResultsUnacknowledged")[0]["expr"].endswith("> 900"))
        self.assertTrue(by_alert(custom, "GraceguardSidecarResultsUnacknowledged")[0]["expr"].endswith("> 300"))
        # Half of each webhook's timeout: 2 s (1 s for the tagger) by default.
        for name in ("GraceguardAdmissionLatencyNearTimeout", "GraceguardAdmissionCallLatencyNearTimeout"):
            self.assertEqual(re.findall(r"> (\d+) / 2000", by_alert(default, name)[0]["expr"]), ["2000", "1000"], name)
            self.assertEqual(re.findall(r"> (\d+) / 2000", by_alert(custom, name)[0]["expr"]), ["10000", "1000"], name)

    def test_schema_refuses_bad_rule_values(self) -> None:
        for what, pr in (("expiry days 0", {"certificateExpiryDays": 0}),
                         ("expiry days as text", {"certificateExpiryDays": "14"}),
                         ("unknown key", {"selector": "job=\"x\""}),
                         ("label value a number", {"additionalLabels": {"tier": 1}})):
            with self.subTest(what):
                with self.assertRaises(cl.HelmValuesError):
                    cl.validate_schema({"metrics": {"prometheusRule": pr}})


class TestPromtoolUnitTests(unittest.TestCase):
    """promtool/*.yaml, each run with `promtool test rules` next to the rules
    rendered with its values."""

    def run_unit_tests(self, test_file: str, values: dict[str, Any]) -> None:
        rule = prometheus_rule(values)
        with tempfile.TemporaryDirectory(prefix="graceguard-chart-tests-promtool-") as d:
            Path(d, "rules.yaml").write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
            shutil.copy(PROMTOOL_TESTS_DIR / test_file, Path(d, test_file))
            res = promtool("test", "rules", test_file, cwd=d)
        if res.returncode != 0 or "SUCCESS" not in res.stdout:
            self.fail(f"promtool test rules {test_file} failed against the rules rendered with {values}:\n"
                      f"{res.stdout}{res.stderr}")

    def test_every_file_has_its_values(self) -> None:
        self.assertEqual(sorted(p.name for p in PROMTOOL_TESTS_DIR.glob("*.yaml")), sorted(PROMTOOL_TESTS))
        for name in PROMTOOL_TESTS:
            doc = yaml.safe_load((PROMTOOL_TESTS_DIR / name).read_text())
            self.assertEqual(doc["rule_files"], ["rules.yaml"], name)

    def test_unit_tests_pass(self) -> None:
        for name, values in PROMTOOL_TESTS.items():
            with self.subTest(name):
                self.run_unit_tests(name, values)

    def test_every_tested_alert_exists(self) -> None:
        """An alert test of a name the rules lack passes vacuously: every name
        the tests use must be in the render (or disabled by its values)."""
        for name, values in PROMTOOL_TESTS.items():
            with self.subTest(name):
                have = alert_names(prometheus_rule(values))
                off = set(values.get("metrics", {}).get("prometheusRule", {}).get("disabled", []))
                doc = yaml.safe_load((PROMTOOL_TESTS_DIR / name).read_text())
                used = {a["alertname"] for t in doc["tests"] for a in t.get("alert_rule_test") or []}
                self.assertEqual(used - have - off, set())
                self.assertTrue(off <= used, "each disabled alert is tested to stay silent")

    def test_every_alert_fires_and_stays_silent_on_healthy_series(self) -> None:
        doc = yaml.safe_load((PROMTOOL_TESTS_DIR / "default.yaml").read_text())
        fires: dict[str, list[dict[str, Any]]] = {}
        healthy: set[str] = set()
        for t in doc["tests"]:
            for a in t.get("alert_rule_test") or []:
                if a.get("exp_alerts"):
                    fires.setdefault(a["alertname"], []).extend(a["exp_alerts"])
                elif t["name"] == "healthy":
                    healthy.add(a["alertname"])
        rule = prometheus_rule({})
        for r in rules_of(rule):
            with self.subTest(alert=r["alert"], severity=r["labels"]["severity"]):
                self.assertIn(r["alert"], healthy, "no test that it stays silent on the healthy series")
                expected = [e for e in fires.get(r["alert"], []) if e["exp_labels"].get("severity") == r["labels"]["severity"]]
                self.assertTrue(expected, "no test where it fires (with this severity)")
                for e in expected:
                    self.assertEqual(set(e["exp_annotations"]), {"summary", "description"})
                    self.assertEqual(e["exp_annotations"]["summary"], r["annotations"]["summary"])


# ================================================================ the dashboard

class TestGrafanaDashboard(unittest.TestCase):
    def test_configmap(self) -> None:
        self.assertEqual([o for o in rendered({}, ()).of_kind("ConfigMap") if o["metadata"]["name"].endswith("-dashboard")], [])
        cm = dashboard_configmap({})
        self.assertEqual(cm["metadata"]["namespace"], NAMESPACE)
        self.assertEqual(cm["metadata"]["labels"]["grafana_dashboard"], "1")
        self.assertNotIn("annotations", cm["metadata"])
        self.assertEqual(list(cm["data"]), ["graceguard.json"])
        custom = dashboard_configmap({"metrics": {"grafanaDashboard": {
            "label": "grafana_dashboard_graceguard", "labelValue": "yes", "namespace": "monitoring",
            "annotations": {"grafana_folder": "Platform"}}}})
        md = custom["metadata"]
        self.assertEqual(md["labels"]["grafana_dashboard_graceguard"], "yes")
        self.assertNotIn("grafana_dashboard", md["labels"])
        self.assertEqual(md["namespace"], "monitoring")
        self.assertEqual(md["annotations"], {"grafana_folder": "Platform"})

    def test_json_is_the_file(self) -> None:
        dash = dashboard()
        self.assertEqual(dash, json.loads((cl.CHART_DIR / "files" / "grafana-dashboard.json").read_text()))
        self.assertEqual((dash["uid"], dash["title"]), ("graceguard", "graceguard"))
        ids = [p["id"] for p in panels(dash)]
        self.assertEqual(len(ids), len(set(ids)), "panel ids are unique")

    def test_every_panel_has_a_datasource(self) -> None:
        dash = dashboard()
        ds_vars = {v["name"] for v in dash["templating"]["list"] if v["type"] == "datasource"}
        self.assertTrue(ds_vars)
        for p in panels(dash):
            if p["type"] == "row":
                continue
            with self.subTest(panel=p["title"]):
                ds = p.get("datasource")
                self.assertIsInstance(ds, dict)
                self.assertEqual(ds.get("type"), "prometheus")
                self.assertIn(next(iter(variables_used(ds.get("uid", ""))), None), ds_vars)
                self.assertTrue(p.get("targets"), "a panel without a query")
                for t in p["targets"]:
                    self.assertEqual(t.get("datasource", ds), ds)

    def test_every_query_is_valid_promql(self) -> None:
        dash = dashboard()
        rules = []
        for p in panels(dash):
            for t in p.get("targets") or []:
                self.assertTrue(t.get("expr"), f"{p['title']} {t.get('refId')}: no expr")
                rules.append({"record": f"graceguard_dashboard:panel_{p['id']}:{t['refId']}",
                              "expr": substitute(t["expr"])})
        # The variables' own queries: label_values(SELECTOR, label).
        for v in dash["templating"]["list"]:
            if v["type"] == "query":
                q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
                m = re.fullmatch(r"label_values\((.+), *(\w+)\)", q)
                self.assertIsNotNone(m, f"variable {v['name']}: {q}")
                rules.append({"record": f"graceguard_dashboard:variable_{v['name']}", "expr": substitute(m.group(1))})
        self.assertGreater(len(rules), 30)
        check_rules({"groups": [{"name": "graceguard-dashboard", "rules": rules}]}, "the dashboard's queries")

    def test_every_variable_is_defined(self) -> None:
        dash = dashboard()
        defined: list[str] = []
        for v in dash["templating"]["list"]:
            q = v.get("query")
            text = json.dumps(q) + json.dumps(v.get("datasource"))
            with self.subTest(variable=v["name"]):
                # Grafana resolves variables in order: only earlier ones.
                self.assertEqual(variables_used(text) - set(defined), set())
            defined.append(v["name"])
        self.assertEqual(len(defined), len(set(defined)))
        for p in panels(dash):
            used = variables_used(json.dumps(p.get("datasource"))) | variables_used(json.dumps(p.get("targets") or []))
            with self.subTest(panel=p["title"]):
                self.assertEqual(used - set(defined) - set(GRAFANA_BUILTINS), set())


# ================================================================ metric names

class TestSeriesNames(unittest.TestCase):
    def test_rules_and_dashboard_read_exported_series(self) -> None:
        exported = exported_series()
        self.assertIn("graceguard_admission_review_seconds_bucket", exported)
        self.assertIn("graceguard_sidecar_transitions_dropped_total", exported)
        self.assertIn("graceguard_index_ready", exported)
        read: dict[str, set[str]] = {}
        for r in rules_of(prometheus_rule({})):
            for n in series_names(r["expr"]):
                read.setdefault(n, set()).add(r["alert"])
        for p in panels(dashboard()):
            for t in p.get("targets") or []:
                for n in series_names(t["expr"]):
                    read.setdefault(n, set()).add(f"panel {p['title']!r}")
        unknown = {n: sorted(w) for n, w in read.items() if n not in exported and n not in NOT_GRACEGUARD}
        self.assertEqual(unknown, {}, "series graceguard does not export")
        self.assertEqual(NOT_GRACEGUARD - set(read), set(), "NOT_GRACEGUARD names a series nothing reads")


if __name__ == "__main__":
    unittest.main()
