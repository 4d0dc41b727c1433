"""Shared helpers of the chart tests: render and lint charts/graceguard with the
real Helm v4 engine (helm-python-sdk) and parse what it renders.

Run with the venv that scripts/helm-venv.sh makes ($GRACEGUARD_PY).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml
from helm_python import _native

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

_chart: helm.Chart | None = None


def chart() -> helm.Chart:
    """The chart, loaded once per test run."""
    global _chart
    if _chart is None:
        _chart = helm.Chart.load(str(CHART_DIR))
    return _chart


def ci_values_files() -> list[Path]:
    files = sorted(CI_DIR.glob("*-values.yaml"))
    if not files:
        raise AssertionError(f"no ci/*-values.yaml in {CHART_DIR}")
    return files


def load_values(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def render(
    values: dict[str, Any] | None = None,
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
    kube_version: str | None = None,
    api_versions: list[str] | None = None,
) -> dict[str, str]:
    """Render offline, like `helm template`; returns {template path: text}.

    helm-python-sdk's Chart.render() exposes no kube_version/api_versions, but
    its native helm_render takes them (the CLI's --kube-version and
    --api-versions), so those renders call it directly.
    """
    if kube_version is None and api_versions is None:
        return chart().render(values or {}, name=name, namespace=namespace)
    opts: dict[str, Any] = {"name": name, "namespace": namespace}
    if kube_version is not None:
        opts["kube_version"] = kube_version
    if api_versions is not None:
        opts["api_versions"] = api_versions
    out = _native.call_string("helm_render", chart()._raw(), json.dumps(values or {}), json.dumps(opts))
    return json.loads(out)


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


def lint(
    values: dict[str, Any], *, kube_version: str | None = None, chart_dir: Path = CHART_DIR
) -> list[tuple[int, str, str]]:
    """`helm lint --strict` of the chart directory; returns the findings that
    are not accepted (plus any hard errors), as (severity, path, message)."""
    report = helm.lint(str(chart_dir), values, strict=True, namespace=NAMESPACE, kube_version=kube_version)
    if report.get("total_charts_linted") != 1:
        return [(3, str(chart_dir), f"lint looked at {report.get('total_charts_linted')} charts, not 1")]
    bad = [
        (m["severity"], m["path"], m["error"])
        for m in report.get("messages") or []
        if (m["severity"], m["path"], m["error"]) not in ACCEPTED_LINT_MESSAGES
    ]
    bad += [(3, "", e) for e in report.get("errors") or []]
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
