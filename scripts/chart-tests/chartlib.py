"""Shared helpers of the chart tests: render and lint charts/graceguard with the
real helm CLI (Helm 4, built by scripts/install-helm; $GRACEGUARD_HELM) and
parse what it renders. $GRACEGUARD_HELM3 names Helm 3, which test_helm3.py
checks the chart with too.

Run with the venv that scripts/helm-venv.sh makes ($GRACEGUARD_PY).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
# GRACEGUARD_CHART_DIR points the tests at another copy of the chart (e.g. to
# check that they catch a deliberately broken one).
CHART_DIR = Path(os.environ.get("GRACEGUARD_CHART_DIR") or REPO_ROOT / "charts" / "graceguard")
CI_DIR = CHART_DIR / "ci"
RELEASE = "graceguard"
NAMESPACE = "graceguard"

# The one lint finding accepted: Helm's INFO that Chart.yaml has no icon (the
# project publishes none). Any other finding, of any severity, fails the tests.
ACCEPTED_LINT_MESSAGES = {(1, "Chart.yaml", "icon is recommended")}


class HelmError(Exception):
    """helm refused the chart or the values; the text is what it printed."""


class HelmValuesError(HelmError):
    """The values do not meet values.schema.json."""


def helm_bin(var: str = "GRACEGUARD_HELM") -> str:
    path = os.environ.get(var, "")
    if not path or not os.access(path, os.X_OK):
        raise AssertionError(f"{var} does not name the helm CLI ({path!r}): run through scripts/test, or "
                             f"export {var}=$(scripts/install-helm --json | jq -r .{'helm3' if var.endswith('3') else 'helm'})")
    return path


_home: str | None = None


def run_helm(*args: str, bin_var: str = "GRACEGUARD_HELM") -> subprocess.CompletedProcess:
    """Runs helm with its own config/cache/data directories and no cluster."""
    global _home
    if _home is None:
        _home = tempfile.mkdtemp(prefix="graceguard-chart-tests-helm-")
    env = dict(os.environ)
    for d in ("CONFIG", "CACHE", "DATA"):
        env[f"HELM_{d}_HOME"] = os.path.join(_home, d.lower())
    env.pop("KUBECONFIG", None)
    return subprocess.run([helm_bin(bin_var), *args], capture_output=True, text=True, env=env)


def helm(*args: str, bin_var: str = "GRACEGUARD_HELM") -> str:
    """helm ARGS' stdout; raises HelmError (HelmValuesError for a schema
    failure) with what it printed."""
    res = run_helm(*args, bin_var=bin_var)
    if res.returncode != 0:
        err = (res.stderr or res.stdout).strip()
        if "don't meet the specifications of the schema" in err:
            raise HelmValuesError(err)
        raise HelmError(err)
    return res.stdout


def ci_values_files() -> list[Path]:
    files = sorted(CI_DIR.glob("*-values.yaml"))
    if not files:
        raise AssertionError(f"no ci/*-values.yaml in {CHART_DIR}")
    return files


def load_values(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def values_file(values: dict[str, Any] | None, d: str) -> str:
    path = os.path.join(d, "values.json")
    Path(path).write_text(json.dumps(values or {}))
    return path


def merge_values(values: dict[str, Any]) -> dict[str, Any]:
    """The chart's values.yaml with `values` over it, as Helm coalesces them:
    maps merge key by key, anything else replaces, null removes a default."""
    def merge(base: Any, over: Any) -> Any:
        if isinstance(base, dict) and isinstance(over, dict):
            out = dict(base)
            for k, v in over.items():
                if v is None:
                    out.pop(k, None)
                else:
                    out[k] = merge(base.get(k), v)
            return out
        return copy.deepcopy(over)
    return merge(load_values(CHART_DIR / "values.yaml"), values)


def validate_schema(values: dict[str, Any]) -> None:
    """Raises HelmValuesError unless helm accepts `values` against the
    chart's values.schema.json (checked before any template runs)."""
    render(values, chart_dir=str(CHART_DIR))


# The notes are rendered by a copy of the chart with one extra template that
# puts NOTES.txt into a ConfigMap (`helm template` prints no NOTES).
NOTES_OBJECT = "graceguard-chart-tests-notes"
_notes_chart: str | None = None


def _chart_with_notes() -> str:
    global _notes_chart
    if _notes_chart is None:
        d = tempfile.mkdtemp(prefix="graceguard-chart-tests-")
        shutil.copytree(CHART_DIR, os.path.join(d, "graceguard"))
        Path(d, "graceguard", "templates", "zz-chart-tests-notes.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + NOTES_OBJECT + "\ndata:\n"
            '  notes: {{ include "graceguard/templates/NOTES.txt" . | toJson }}\n')
        _notes_chart = os.path.join(d, "graceguard")
    return _notes_chart


def render(
    values: dict[str, Any] | None = None,
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
    kube_version: str | None = None,
    api_versions: list[str] | None = None,
    bin_var: str = "GRACEGUARD_HELM",
    chart_dir: str | None = None,
) -> dict[str, str]:
    """`helm template`; returns {template path: text}, the NOTES under
    "graceguard/templates/NOTES.txt"."""
    with tempfile.TemporaryDirectory() as d:
        args = ["template", name, chart_dir or _chart_with_notes(), "--namespace", namespace, "-f", values_file(values, d)]
        if kube_version is not None:
            args += ["--kube-version", kube_version]
        for a in api_versions or []:
            args += ["--api-versions", a]
        out = helm(*args, bin_var=bin_var)
    docs: dict[str, list[str]] = {}
    for part in re.split(r"^---\s*$", out, flags=re.M):
        m = re.search(r"^# Source: (\S+)\s*$", part, flags=re.M)
        if m is None:
            if part.strip():
                raise AssertionError(f"helm template printed a document without '# Source:': {part[:200]!r}")
            continue
        docs.setdefault(m.group(1), []).append(part)
    manifests = {path: "---\n".join(parts) for path, parts in docs.items()}
    for path in [p for p in manifests if p.endswith("zz-chart-tests-notes.yaml")]:
        notes = yaml.safe_load(manifests.pop(path))["data"]["notes"]
        manifests["graceguard/templates/NOTES.txt"] = notes
    return manifests


class Rendered:
    """The objects of one render, parsed."""

    def __init__(self, manifests: dict[str, str]):
        self.manifests = manifests
        self.notes = ""
        self.objects: list[dict[str, Any]] = []
        self.sources: dict[int, str] = {}
        for path, text in sorted(manifests.items()):
            if path.endswith("NOTES.txt"):
                self.notes = text
                continue
            for doc in yaml.safe_load_all(text):
                if doc is None:
                    continue
                if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
                    raise AssertionError(f"{path} rendered something that is not a Kubernetes object: {doc!r}")
                self.sources[id(doc)] = path
                self.objects.append(doc)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name]
        if len(found) != 1:
            have = [f"{o['kind']}/{o['metadata']['name']}" for o in self.objects]
            raise AssertionError(f"expected exactly one {kind}{' ' + name if name else ''}, found {len(found)}; rendered: {have}")
        return found[0]

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self.objects)

    def hooks(self) -> list[dict[str, Any]]:
        return [o for o in self.objects if "helm.sh/hook" in (o["metadata"].get("annotations") or {})]

    def release_objects(self) -> list[dict[str, Any]]:
        return [o for o in self.objects if "helm.sh/hook" not in (o["metadata"].get("annotations") or {})]

    def webhook_configurations(self) -> list[dict[str, Any]]:
        return self.of_kind("ValidatingWebhookConfiguration") + self.of_kind("MutatingWebhookConfiguration")

    def webhook(self, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """(configuration, webhook entry) of the webhook called `name`."""
        for cfg in self.webhook_configurations():
            for wh in cfg.get("webhooks") or []:
                if wh["name"] == name:
                    return cfg, wh
        raise AssertionError(f"no webhook named {name}")


def render_objects(values: dict[str, Any] | None = None, **kw: Any) -> Rendered:
    return Rendered(render(values, **kw))


_LINT_LINE = re.compile(r"^\[(INFO|WARNING|ERROR)\] ([^:]*): (.*)$")
_SEVERITY = {"INFO": 1, "WARNING": 2, "ERROR": 3}


def lint(
    values: dict[str, Any], *, kube_version: str | None = None, chart_dir: Path = CHART_DIR,
    bin_var: str = "GRACEGUARD_HELM",
) -> list[tuple[int, str, str]]:
    """`helm lint --strict` of the chart directory; returns the findings that
    are not accepted (plus a failed run), as (severity, path, message)."""
    with tempfile.TemporaryDirectory() as d:
        args = ["lint", str(chart_dir), "--strict", "--namespace", NAMESPACE, "-f", values_file(values, d)]
        if kube_version is not None:
            args += ["--kube-version", kube_version]
        res = run_helm(*args, bin_var=bin_var)
    findings = []
    for line in res.stdout.splitlines():
        m = _LINT_LINE.match(line.strip())
        if m:
            findings.append((_SEVERITY[m.group(1)], m.group(2), m.group(3)))
    if "1 chart(s) linted" not in res.stdout + res.stderr:
        findings.append((3, str(chart_dir), f"helm lint did not lint 1 chart: {res.stdout} {res.stderr}"))
    bad = [f for f in findings if f not in ACCEPTED_LINT_MESSAGES]
    if res.returncode != 0 and not bad:
        bad.append((3, str(chart_dir), f"helm lint failed: {res.stdout} {res.stderr}"))
    return bad


def b64pem(data: str) -> str:
    return base64.b64decode(data, validate=True).decode()


def openssl(*args: str, stdin: str | None = None) -> str:
    exe = shutil.which("openssl")
    if exe is None:
        raise AssertionError("openssl is needed to check the generated certificates (apt-get install openssl)")
    res = subprocess.run([exe, *args], input=stdin, capture_output=True, text=True)
    if res.returncode != 0:
        raise AssertionError(f"openssl {' '.join(args)} failed: {res.stderr.strip()}")
    return res.stdout


def verify_chain(ca_pem: str, cert_pem: str) -> None:
    """openssl verify: cert_pem is signed by ca_pem (raises otherwise)."""
    with tempfile.TemporaryDirectory() as d:
        ca = os.path.join(d, "ca.crt")
        crt = os.path.join(d, "tls.crt")
        Path(ca).write_text(ca_pem)
        Path(crt).write_text(cert_pem)
        out = openssl("verify", "-purpose", "sslserver", "-CAfile", ca, crt)
        if not out.strip().endswith("OK"):
            raise AssertionError(f"openssl verify: {out}")


def cert_dns_names(cert_pem: str) -> set[str]:
    text = openssl("x509", "-noout", "-ext", "subjectAltName", stdin=cert_pem)
    return {part.strip()[len("DNS:"):] for part in text.replace("\n", ",").split(",") if part.strip().startswith("DNS:")}


def yaml_file(path: Path) -> Any:
    """A YAML file of the chart, parsed (e.g. files/match-conditions.yaml)."""
    return yaml.safe_load(path.read_text())
