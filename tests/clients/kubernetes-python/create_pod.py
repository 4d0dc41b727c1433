"""Creates one pod name N times with the official Kubernetes Python client
(`kubernetes` on PyPI), as a user's script would, and prints what each call
returned: the tests use it to show what a user of that client sees when
graceguard answers 429 (the client does not retry by itself).

    python create_pod.py --kubeconfig FILE --namespace NS --name NAME --image IMAGE [--count N]

Prints one JSON list: [{"status", "reason", "retry_after", "seconds", "message"}].
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from kubernetes import client, config
from kubernetes.client.rest import ApiException


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--image", required=True)
    p.add_argument("--count", type=int, default=3)
    a = p.parse_args()
    config.load_kube_config(config_file=a.kubeconfig)
    api = client.CoreV1Api()
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=a.name),
        spec=client.V1PodSpec(
            restart_policy="Never",
            containers=[client.V1Container(name="main", image=a.image, command=["sleep", "3600"])],
        ),
    )
    out = []
    for _ in range(a.count):
        start = time.monotonic()
        try:
            api.create_namespaced_pod(a.namespace, pod)
            out.append({"status": 201, "reason": "Created", "retry_after": None,
                        "seconds": round(time.monotonic() - start, 3), "message": ""})
        except ApiException as e:
            body = {}
            try:
                body = json.loads(e.body or "{}")
            except ValueError:
                pass
            out.append({
                "status": e.status,
                "reason": body.get("reason", e.reason),
                "retry_after": (e.headers or {}).get("Retry-After"),
                "seconds": round(time.monotonic() - start, 3),
                "message": body.get("message", ""),
            })
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
