"""Scan the rendered chart with checkov's Kubernetes checks: every failed check
must be explained in checkov-accepted.yaml, and every entry there must still
fail exactly where it says.

All renders go to one directory and one checkov run (its start-up is most of
the cost). checkov links objects across files by name and labels (a
NetworkPolicy's podSelector, a binding's ServiceAccount), never by namespace,
so each render gets a release name of its own ("graceguard-<render>", which is
also the objects' full name); findings are reported back under the names of
the release "graceguard". The scan is offline: no API key, --skip-download, no
version check, and no config file or CKV_/BC_ variable of the caller's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import chartlib as cl

HERE = Path(__file__).resolve().parent
ACCEPTED_FILE = HERE / "checkov-accepted.yaml"
VENV_SCRIPT = cl.REPO_ROOT / "scripts" / "helm-venv.sh"
HOW_TO_RUN = 'source scripts/helm-venv.sh && "$GRACEGUARD_PY" scripts/chart-tests/run.py'

# What the ci files leave off and checkov has checks for: the NetworkPolicy
# (CKV2_K8S_6), an image pinned by digest (CKV_K8S_43, CKV_K8S_15); also a
# PriorityClass, and the ServiceMonitor that the newest supported Kubernetes
# with the Prometheus Operator gets.
OPTIONS_RENDER = (
    {
        "networkPolicy": {
            "enabled": True,
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
            "egress": {"enabled": True, "apiServerCIDRs": ["10.0.0.10/32"]},
        },
        "image": {"digest": "sha256:" + "0" * 64},
        "priorityClassName": "platform-critical",
        "metrics": {"serviceMonitor": {"enabled": True}},
    },
    {"kube_version": "v1.37.2", "api_versions": ["monitoring.coreos.com/v1"]},
)


def renders() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """{render name: (values, render keywords)}."""
    out = {p.name[: -len("-values.yaml")]: (cl.load_values(p), {}) for p in cl.ci_values_files()}
    out["options"] = OPTIONS_RENDER
    return out


def release_of(render: str) -> str:
    # Contains "graceguard", so the chart's full name is the release name.
    return f"graceguard-{render.lower()}"


def pinned_checkov() -> str:
    m = re.search(r"\bcheckov==([0-9][0-9A-Za-z.]*)", VENV_SCRIPT.read_text())
    if not m:
        raise AssertionError(f"{VENV_SCRIPT} pins no checkov==VERSION in _GG_HELM_PACKAGES")
    return m.group(1)


@dataclass
class Accepted:
    check: str
    resource: str
    renders: frozenset[str]
    reason: str


def load_accepted(render_names: set[str]) -> list[Accepted]:
    """checkov-accepted.yaml, checked for form (raises AssertionError)."""
    entries = yaml.safe_load(ACCEPTED_FILE.read_text())
    if not isinstance(entries, list):
        raise AssertionError(f"{ACCEPTED_FILE.name}: expected a list of entries")
    out, seen, problems = [], set(), []
    for i, e in enumerate(entries):
        where = f"{ACCEPTED_FILE.name} entry {i + 1}"
        if not isinstance(e, dict) or not {"check", "resource", "reason"} <= set(e) or not set(e) <= {"check", "resource", "reason", "renders"}:
            problems.append(f"{where}: needs check, resource and reason (and optionally renders), has {e!r}")
            continue
        if not re.fullmatch(r"CKV2?_K8S_\d+", str(e["check"])):
            problems.append(f"{where}: {e['check']!r} is not a checkov Kubernetes check id")
        if not isinstance(e["reason"], str) or len(e["reason"].split()) < 8:
            problems.append(f"{where} ({e['check']} {e['resource']}): the reason must say why, in a sentence or more")
        names = e.get("renders", sorted(render_names))
        if not isinstance(names, list) or not names or not set(names) <= render_names:
            problems.append(f"{where}: renders must be a non-empty list of {sorted(render_names)}, is {names!r}")
            names = []
        key = (e["check"], e["resource"])
        if key in seen:
            problems.append(f"{where}: {key} is listed twice")
        seen.add(key)
        out.append(Accepted(e["check"], e["resource"], frozenset(names), e["reason"]))
    if problems:
        raise AssertionError("\n".join(problems))
    return out


@dataclass
class Finding:
    check: str
    name: str
    resource: str  # as for the release "graceguard"
    render: str
    file: str


@dataclass
class Scan:
    version: str
    summary: dict[str, Any]
    objects: int  # rendered objects, all renders
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0


def _canonical(resource: str, release: str, templates: dict[str, str]) -> str:
    """checkov's "Kind.namespace.name" (cluster-scoped: namespace "default"; a
    workload's pod template: "Pod.namespace.<workload>.<labels>") as Kind/name
    of the release "graceguard"."""

    def rename(name: str) -> str:
        return "graceguard" + name[len(release):] if name.startswith(release) else name

    kind, _, rest = resource.partition(".")
    _namespace, _, name = rest.partition(".")
    parent, dot, _labels = name.partition(".")
    if kind == "Pod" and dot and parent in templates:
        return f"{templates[parent]}/{rename(parent)} pod template"
    return f"{kind}/{rename(name)}"


def _checkov_env(home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BC_", "CKV_", "CHECKOV_", "PRISMA_"))}
    env.update({
        "HOME": home,  # no ~/.checkov.yaml of the caller's
        "BC_SKIP_MAPPING": "TRUE",  # no policy metadata download
        "CKV_SKIP_PACKAGE_UPDATE_CHECK": "true",  # no "new version" look-up
        "LOG_LEVEL": "WARNING",
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    return env


def run_scan() -> Scan:
    want = pinned_checkov()
    if importlib.util.find_spec("checkov") is None:
        raise AssertionError(
            f"checkov is not installed for {sys.executable}. The chart tests need the venv of "
            f"scripts/helm-venv.sh, which installs checkov=={want}: {HOW_TO_RUN} "
            "(sourcing it rebuilds a venv made before checkov was pinned).")
    all_renders = renders()
    with tempfile.TemporaryDirectory(prefix="graceguard-checkov-") as tmp:
        scan_dir = Path(tmp) / "renders"
        templates: dict[str, dict[str, str]] = {}
        objects = 0
        for name, (values, kw) in all_renders.items():
            release = release_of(name)
            manifests = cl.render(values, name=release, **kw)
            parsed = cl.Rendered(manifests)
            objects += len(parsed.objects)
            templates[name] = {o["metadata"]["name"]: o["kind"] for o in parsed.objects
                               if isinstance((o.get("spec") or {}).get("template"), dict)}
            for path, text in manifests.items():
                if path.endswith("NOTES.txt") or not text.strip():
                    continue
                out = scan_dir / name / path
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(text)
        cmd = [sys.executable, "-m", "checkov.main", "--directory", str(scan_dir), "--framework", "kubernetes",
               "--output", "json", "--quiet", "--compact", "--skip-download", "--skip-results-upload"]
        start = time.monotonic()
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=_checkov_env(tmp), timeout=600)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"checkov took over 600s: {' '.join(cmd)}") from None
        seconds = time.monotonic() - start
        stderr = "\n".join(res.stderr.strip().splitlines()[-20:])
        # 0: nothing failed, 1: some check failed; anything else is checkov's own error.
        if res.returncode not in (0, 1):
            raise AssertionError(f"checkov could not run (exit {res.returncode}): {' '.join(cmd)}\n{stderr}\n"
                                 f"Rebuild the venv with: {HOW_TO_RUN}")
        try:
            report = json.loads(res.stdout)
        except json.JSONDecodeError as e:
            raise AssertionError(f"checkov printed no JSON report ({e}); stdout starts {res.stdout[:300]!r}\n{stderr}") from None
        if isinstance(report, list):  # one report per framework; only kubernetes runs
            report = next((r for r in report if r.get("check_type") == "kubernetes"), {})
        if report.get("check_type") != "kubernetes" or "summary" not in report:
            raise AssertionError(f"checkov returned no kubernetes report: {res.stdout[:300]!r}\n{stderr}")
        summary = report["summary"]
        scan = Scan(version=str(summary.get("checkov_version")), summary=summary, objects=objects, seconds=seconds)
        root = scan_dir.resolve()
        for f in (report.get("results") or {}).get("failed_checks") or []:
            rel = Path(f["file_abs_path"]).resolve().relative_to(root)
            render = rel.parts[0]
            scan.findings.append(Finding(
                check=f["check_id"], name=f["check_name"], render=render, file="/".join(rel.parts[1:]),
                resource=_canonical(f["resource"], release_of(render), templates[render])))
    return scan


_scan: Scan | None = None
_scan_error: Exception | None = None


def scan() -> Scan:
    """The scan, run once per test run; a failure to run fails every test here."""
    global _scan, _scan_error
    if _scan is None and _scan_error is None:
        try:
            _scan = run_scan()
            print(f"\n  checkov {_scan.version}: {_scan.summary.get('resource_count')} resources in {len(renders())} renders, "
                  f"{_scan.summary.get('passed')} passed, {_scan.summary.get('failed')} failed, {_scan.seconds:.1f}s",
                  file=sys.stderr)
        except Exception as e:  # noqa: BLE001 - kept and raised again in every test
            _scan_error = e
    if _scan_error is not None:
        raise AssertionError(f"the checkov scan failed: {_scan_error}") from _scan_error
    assert _scan is not None
    return _scan


class TestCheckovScan(unittest.TestCase):
    maxDiff = None

    def accepted(self) -> list[Accepted]:
        return load_accepted(set(renders()))

    def test_accepted_list_is_well_formed(self) -> None:
        self.assertTrue(self.accepted())

    def test_checkov_is_the_pinned_version_and_read_every_render(self) -> None:
        s = scan()
        want = pinned_checkov()
        self.assertEqual(s.version, want, f"checkov {s.version} ran, but scripts/helm-venv.sh pins {want} and "
                         f"{ACCEPTED_FILE.name} is written for it; rebuild the venv: {HOW_TO_RUN}")
        self.assertEqual(s.summary.get("parsing_errors"), 0, s.summary)
        # Each rendered object is one resource to checkov (a pod template one more).
        self.assertGreaterEqual(s.summary.get("resource_count", 0), s.objects, s.summary)
        self.assertGreater(s.summary.get("passed", 0), 0, s.summary)

    def test_every_failed_check_is_accepted(self) -> None:
        accepted = {(a.check, a.resource): a for a in self.accepted()}
        unexplained: dict[tuple[str, str, str, str], list[str]] = {}
        for f in scan().findings:
            a = accepted.get((f.check, f.resource))
            if a is None or f.render not in a.renders:
                unexplained.setdefault((f.check, f.name, f.resource, f.file), []).append(f.render)
        if unexplained:
            self.fail("checkov found failures that checkov-accepted.yaml does not explain; fix the chart, or add "
                      "each with the reason it is right for a production cluster:\n" + "\n".join(
                          f"  {check} ({name}) on {resource} ({file}) in renders {sorted(where)}"
                          for (check, name, resource, file), where in sorted(unexplained.items())))

    def test_no_stale_acceptance(self) -> None:
        failing: dict[tuple[str, str], set[str]] = {}
        for f in scan().findings:
            failing.setdefault((f.check, f.resource), set()).add(f.render)
        stale = []
        for a in self.accepted():
            missing = a.renders - failing.get((a.check, a.resource), set())
            if missing:
                stale.append(f"  {a.check} on {a.resource}: no longer fails in renders {sorted(missing)}")
        if stale:
            self.fail("checkov-accepted.yaml accepts failures that checkov no longer reports; remove the entries, "
                      "or narrow their renders:\n" + "\n".join(stale))

if __name__ == "__main__":
    unittest.main()
