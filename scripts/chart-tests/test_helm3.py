"""The chart with Helm 3 ($GRACEGUARD_HELM3, helm.sh/helm/v3; it receives
security fixes only, but many clusters are still managed with it): each
ci/*-values.yaml lints clean with `helm lint --strict` and renders the same
objects (kind, name, namespace) as with Helm 4, at Helm's default Kubernetes
version and at both ends of the supported window (v1.30.0 and v1.37.2); and
Helm 3 too refuses a server older than Chart.yaml's kubeVersion."""

from __future__ import annotations

import unittest

import chartlib as cl

HELM3 = "GRACEGUARD_HELM3"


def identities(manifests: dict[str, str]) -> list[tuple[str, str, str]]:
    r = cl.Rendered(manifests)
    return sorted((o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", "")) for o in r.objects)


class TestHelm3(unittest.TestCase):
    def test_it_is_helm_3(self) -> None:
        self.assertRegex(cl.helm("version", "--template", "{{.Version}}", bin_var=HELM3), r"^v3\.")

    def test_ci_values_lint_and_render_like_helm_4(self) -> None:
        for path in cl.ci_values_files():
            values = cl.load_values(path)
            for kube in (None, "v1.30.0", "v1.37.2"):
                with self.subTest(values=path.name, kube_version=kube or "default"):
                    self.assertEqual(cl.lint(values, kube_version=kube, bin_var=HELM3), [])
                    three = cl.render(values, kube_version=kube, bin_var=HELM3)
                    four = cl.render(values, kube_version=kube)
                    self.assertEqual(identities(three), identities(four))
                    self.assertEqual(three.get("graceguard/templates/NOTES.txt"), four.get("graceguard/templates/NOTES.txt"))

    def test_refuses_kubernetes_older_than_1_30(self) -> None:
        for kube in ("v1.29.9", "v1.20.2"):
            with self.subTest(kube_version=kube), self.assertRaises(cl.HelmError) as ctx:
                cl.render({}, kube_version=kube, bin_var=HELM3)
            self.assertIn(">=1.30.0-0", str(ctx.exception))
            self.assertIn(kube, str(ctx.exception))

    def test_schema_refusal(self) -> None:
        with self.assertRaises(cl.HelmValuesError):
            cl.render({"replicaCount": "two"}, bin_var=HELM3)


if __name__ == "__main__":
    unittest.main()
