"""The claim `GraceguardKubernetesExecutor` sends when it adopts a completed
pod is always conditional on a resourceVersion: the latest list's, else one
read just before; never an unconditional patch (two schedulers would then
both adopt the pod). Run with an Airflow venv's Python (scripts/test):

    python -m unittest discover -s integrations/airflow/tests
"""

from __future__ import annotations

import unittest
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

from kubernetes.client.rest import ApiException

from graceguard_airflow.executor import _ConditionalClaims


class FakeKube:
    """Records patches; answers reads with `read_version`."""

    def __init__(self, read_version: Optional[str]) -> None:
        self.read_version = read_version
        self.patches: List[Dict[str, Any]] = []
        self.reads = 0
        self.api_client = SimpleNamespace(sanitize_for_serialization=lambda b: {"metadata": dict(b.metadata)})

    def read_namespaced_pod(self, name: str, namespace: str) -> Any:
        self.reads += 1
        return SimpleNamespace(metadata=SimpleNamespace(resource_version=self.read_version))

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kwargs: Any) -> Any:
        self.patches.append(body)
        return body


def claims(kube: FakeKube, listed: Dict[Any, str]) -> _ConditionalClaims:
    executor = SimpleNamespace(_listed_versions=listed)
    return _ConditionalClaims(kube, executor)  # type: ignore[arg-type]


LABEL = {"metadata": {"labels": {"airflow-worker": "7"}}}


class ClaimTest(unittest.TestCase):
    def test_a_listed_pod_is_claimed_on_its_listed_version(self) -> None:
        kube = FakeKube(read_version="99")
        claims(kube, {("ns", "p"): "41"}).patch_namespaced_pod(name="p", namespace="ns", body=LABEL)
        self.assertEqual(kube.patches, [{"metadata": {"labels": {"airflow-worker": "7"}, "resourceVersion": "41"}}])
        self.assertEqual(kube.reads, 0)

    def test_a_pod_the_list_did_not_hold_is_read_and_claimed_on_that_version(self) -> None:
        kube = FakeKube(read_version="42")
        claims(kube, {}).patch_namespaced_pod(name="p", namespace="ns", body=LABEL)
        self.assertEqual(kube.patches[0]["metadata"]["resourceVersion"], "42")
        self.assertEqual(kube.reads, 1)

    def test_a_body_that_is_no_dict_is_made_one_and_claimed_conditionally(self) -> None:
        kube = FakeKube(read_version=None)
        body = SimpleNamespace(metadata={"labels": {"airflow-worker": "7"}})
        claims(kube, {("ns", "p"): "43"}).patch_namespaced_pod(name="p", namespace="ns", body=body)
        self.assertEqual(kube.patches, [{"metadata": {"labels": {"airflow-worker": "7"}, "resourceVersion": "43"}}])

    def test_no_version_at_all_is_a_409_and_no_write(self) -> None:
        kube = FakeKube(read_version=None)
        with self.assertRaises(ApiException) as ctx:
            claims(kube, {}).patch_namespaced_pod(name="p", namespace="ns", body=LABEL)
        self.assertEqual(ctx.exception.status, 409)
        self.assertEqual(kube.patches, [])


if __name__ == "__main__":
    unittest.main()
