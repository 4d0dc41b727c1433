"""`GraceguardKubernetesExecutor`: the provider's KubernetesExecutor, with
completed pods of dead schedulers adopted exactly once.

The provider's `_adopt_completed_pods` lists the Succeeded pods no live
scheduler owns and relabels each (`airflow-worker=<this scheduler>`) with
an unconditional patch. Two schedulers that adopt at the same moment both
list a pod, both patch it, and both take its result up (measured with
provider 10.25.0: every pod adopted twice, twice the PATCHes). Here each
claim carries the `resourceVersion` the pod was listed at: the API server
applies the first and answers the others 409 Conflict, which the provider's
own loop already treats as "not adopted" (it logs and moves on). A pod the
latest list did not hold is read first and claimed on the version read; a
claim is never sent unconditionally (a pod with no version to carry is
answered 409 here, without a write). Nothing
else changes: the selector, the draining of the adopted set (fixed upstream
in apache/airflow PR #68674), pod launches and the watcher are the
provider's.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

from airflow.providers.cncf.kubernetes.executors.kubernetes_executor import KubernetesExecutor
from kubernetes.client.rest import ApiException


class _ConditionalClaims:
    """A kube client whose pod patches are conditional on the version each
    pod had in the executor's latest list; every other call goes to the
    real client."""

    def __init__(self, client: Any, executor: "GraceguardKubernetesExecutor") -> None:
        self._client = client
        self._executor = executor

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kwargs: Any) -> Any:
        version = self._executor._listed_versions.get((namespace, name))
        if not version:
            # Not in the latest list: claimed on the version read now.
            pod = self._client.read_namespaced_pod(name=name, namespace=namespace)
            version = getattr(pod.metadata, "resource_version", None)
        if not isinstance(body, dict):
            body = self._client.api_client.sanitize_for_serialization(body)
        if not version or not isinstance(body, dict):
            # Nothing to make the claim conditional on: not adopted, as if
            # another scheduler had claimed it first.
            raise ApiException(
                status=409,
                reason=f"graceguard: pod {namespace}/{name} has no resourceVersion to claim it on; not adopted",
            )
        metadata = dict(body.get("metadata") or {})
        metadata["resourceVersion"] = version
        body = {**body, "metadata": metadata}
        return self._client.patch_namespaced_pod(name=name, namespace=namespace, body=body, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._client, attr)


class GraceguardKubernetesExecutor(KubernetesExecutor):
    """KubernetesExecutor whose completed-pod adoption claims each pod once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._listed_versions: Dict[Tuple[str, str], str] = {}

    def _list_pods(self, query_kwargs: Any) -> Any:
        pods = super()._list_pods(query_kwargs)
        self._listed_versions = {}
        for p in pods:
            m = p.metadata
            # The provider lists through the dynamic client (camelCase
            # fields) or the typed one (snake_case).
            version = getattr(m, "resourceVersion", None) or getattr(m, "resource_version", None)
            if version:
                self._listed_versions[(m.namespace, m.name)] = version
        return pods

    def _adopt_completed_pods(self, kube_client: Any) -> None:
        # The provider lists the pods, then claims each through this client.
        super()._adopt_completed_pods(_ConditionalClaims(kube_client, self))
