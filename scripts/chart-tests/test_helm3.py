"""The chart with Helm 3 ($GRACEGUARD_HELM3, helm.sh/helm/v3; it receives
security fixes only, but many clusters are still managed with it): each
ci/*-values.yaml lints clean with `helm lint --strict` and renders the same
objects (kind, name, namespace) as with Helm 4, at Helm's default Kubernetes
version and at v1.20.2."""

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
            for kube in (None, "v1.20.2"):
                with self.subTest(values=path.name, kube_version=kube or "default"):
                    self.assertEqual(cl.lint(values, kube_version=kube, bin_var=HELM3), [])
                    three = cl.render(values, kube_version=kube, bin_var=HELM3)
                    four = cl.render(values, kube_version=kube)
                    self.assertEqual(identities(three), identities(four))
                    self.assertEqual(three.get("graceguard/templates/NOTES.txt"), four.get("graceguard/templates/NOTES.txt"))

    def test_schema_refusal(self) -> None:
        with self.assertRaises(cl.HelmValuesError):
            cl.render({"replicaCount": "two"}, bin_var=HELM3)


if __name__ == "__main__":
    unittest.main()
