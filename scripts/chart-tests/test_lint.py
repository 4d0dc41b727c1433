"""`helm lint --strict` (the Helm 4 CLI, $GRACEGUARD_HELM) of the chart
with each ci/*-values.yaml, at the linter's default Kubernetes version and at
both ends of the supported window (v1.30.0, the oldest the chart installs on,
and v1.37.2). Any finding fails, except Helm's INFO "icon is recommended" (see
chartlib.ACCEPTED_LINT_MESSAGES). `helm lint` does not check Chart.yaml's
kubeVersion against --kube-version; test_render.py checks that `helm
template` refuses an older server."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

import chartlib as cl

# The supported window's ends: Chart.yaml's kubeVersion (>=1.30.0-0) and the newest tested.
KUBE_VERSIONS = (None, "v1.30.0", "v1.37.2")


class LintPerValuesFile:
    values_file: str

    def test_lint_strict(self) -> None:
        values = cl.load_values(cl.CI_DIR / self.values_file)
        for kube in KUBE_VERSIONS:
            with self.subTest(kube_version=kube or "default"):
                findings = cl.lint(values, kube_version=kube)
                self.assertEqual(findings, [], f"helm lint --strict -f ci/{self.values_file}"
                                 f"{' --kube-version ' + kube if kube else ''}")


for _path in cl.ci_values_files():
    _name = f"TestLint_{_path.name[: -len('-values.yaml')]}_values"
    globals()[_name] = type(_name, (LintPerValuesFile, unittest.TestCase), {"values_file": _path.name})


class TestLintCatchesProblems(unittest.TestCase):
    """The linter really runs: bad values and a broken chart are reported."""

    def test_schema_violation_is_a_finding(self) -> None:
        findings = cl.lint({"replicaCount": "two"})
        self.assertTrue(any(sev == 3 and "replicaCount" in msg for sev, _, msg in findings), findings)

    def test_removed_api_is_a_finding(self) -> None:
        # Helm's lint mode lets `fail` through (it only logs it), so the chart's
        # own refusals are covered by the render tests; here a copy of the chart
        # gets a manifest on an API removed in Kubernetes 1.25.
        with tempfile.TemporaryDirectory() as d:
            copy = Path(d) / "graceguard"
            shutil.copytree(cl.CHART_DIR, copy)
            (copy / "templates" / "old-pdb.yaml").write_text(
                "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget\nmetadata:\n  name: old\n"
                "spec:\n  minAvailable: 1\n  selector:\n    matchLabels:\n      a: b\n")
            findings = cl.lint({}, chart_dir=copy)
        self.assertTrue(any(sev >= 2 and "policy/v1beta1" in msg for sev, _, msg in findings), findings)

if __name__ == "__main__":
    unittest.main()
