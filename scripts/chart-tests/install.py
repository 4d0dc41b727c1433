"""Install charts/graceguard into a real cluster with Helm's install action
(Helm v4's Go library, through helm-python-sdk): first a server-side dry run
(every object goes through the API server's validation and admission without
being stored), then the real install. Exits non-zero with the API server's
message when any object is rejected; prints the release's objects.

    source scripts/helm-venv.sh
    "$GRACEGUARD_PY" scripts/chart-tests/install.py --kubeconfig FILE --namespace NS [--values FILE]...

Options:
  --release NAME      release name (default graceguard)
  --set-json JSON     extra values as a JSON object, merged after the files
  --verify-upgrade    after installing, upgrade the release with the same values
                      and check that the self-signed CA and serving pair in the
                      TLS Secret, and the caBundle of every webhook configuration,
                      are unchanged (the chart reuses them through lookup)
  --kubectl PATH      kubectl used to confirm that each object exists
                      (default: kubectl on PATH; skipped with a note if absent)

It does not wait for pods (no --wait): the objects only need to be accepted.
The last lines printed on stdout are machine-readable:
  serviceaccount=<namespace>/<name>
  release=<name> status=<status> revision=<n>
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

try:
    import helm_python as helm
    import yaml
except ImportError as e:  # pragma: no cover - wrong interpreter
    sys.exit(
        f"install.py: cannot import {e.name} ({e}); run it with the venv from scripts/helm-venv.sh:\n"
        f"  source scripts/helm-venv.sh && \"$GRACEGUARD_PY\" {sys.argv[0]} ..."
    )

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "graceguard"
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}


def die(step: str, detail: str, hint: str | None = None) -> None:
    msg = f"install.py: {step} failed:\n  {detail.strip()}"
    if hint:
        msg += f"\n  fix: {hint}"
    print(msg, file=sys.stderr)
    sys.exit(1)


def merge(into: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            merge(into[k], v)
        else:
            into[k] = v
    return into


def objects_of(manifest: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(manifest or "") if isinstance(d, dict) and d.get("kind")]


def describe(o: dict[str, Any], namespace: str) -> str:
    md = o["metadata"]
    where = "" if o["kind"] in CLUSTER_SCOPED else f"{md.get('namespace') or namespace}/"
    return f"{o['apiVersion']:<34} {o['kind']:<31} {where}{md['name']}"


def kubectl_get(kubectl: str, kubeconfig: str, o: dict[str, Any], namespace: str, jsonpath: str | None = None) -> str:
    api = o["apiVersion"]
    group = api.split("/")[0] if "/" in api else ""
    resource = o["kind"].lower() + (f".{api.split('/')[1]}.{group}" if group else "")
    cmd = [kubectl, "--kubeconfig", kubeconfig, "get", resource, o["metadata"]["name"]]
    if o["kind"] not in CLUSTER_SCOPED:
        cmd += ["-n", o["metadata"].get("namespace") or namespace]
    cmd += ["-o", f"jsonpath={jsonpath}" if jsonpath else "name"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise RuntimeError(res.stderr.strip() or f"{' '.join(cmd)} exited {res.returncode}")
    return res.stdout.strip()


def tls_state(kubectl: str, kubeconfig: str, objs: list[dict[str, Any]], namespace: str) -> dict[str, str]:
    """The live TLS Secret data and caBundles, to compare across an upgrade."""
    state: dict[str, str] = {}
    for o in objs:
        if o["kind"] == "Secret":
            for key in ("ca.crt", "tls.crt", "tls.key"):
                state[f"Secret/{o['metadata']['name']}/{key}"] = kubectl_get(
                    kubectl, kubeconfig, o, namespace, "{.data.%s}" % key.replace(".", "\\."))
        elif o["kind"] in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            state[f"{o['kind']}/{o['metadata']['name']}"] = kubectl_get(
                kubectl, kubeconfig, o, namespace, "{.webhooks[*].clientConfig.caBundle}")
    return state


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--values", action="append", default=[], metavar="FILE")
    p.add_argument("--set-json", default=None, metavar="JSON")
    p.add_argument("--release", default="graceguard")
    p.add_argument("--timeout", type=int, default=120, help="seconds for each Helm action (default 120)")
    p.add_argument("--verify-upgrade", action="store_true")
    p.add_argument("--kubectl", default=None)
    args = p.parse_args()

    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", args.namespace) or len(args.namespace) > 63:
        die("checking --namespace", f"{args.namespace!r} is not a valid namespace name (a lowercase RFC 1123 label)")
    try:
        helm.validate_release_name(args.release)
    except helm.HelmError as e:
        die("checking --release", f"{args.release!r}: {e}")
    if not Path(args.kubeconfig).is_file():
        die("reading --kubeconfig", f"{args.kubeconfig} is not a file")
    values: dict[str, Any] = {}
    for f in args.values:
        try:
            merge(values, yaml.safe_load(Path(f).read_text()) or {})
        except (OSError, yaml.YAMLError) as e:
            die(f"reading values file {f}", str(e))
    if args.set_json:
        try:
            merge(values, json.loads(args.set_json))
        except json.JSONDecodeError as e:
            die("parsing --set-json", str(e))
    kubectl = args.kubectl or shutil.which("kubectl")

    try:
        chart = helm.Chart.load(str(CHART_DIR))
    except helm.HelmError as e:
        die(f"loading the chart {CHART_DIR}", str(e))
    try:
        chart.validate_schema(values)
    except helm.HelmError as e:
        die("validating the values against values.schema.json", str(e))
    mode = chart.merge_values(values)["certs"]["mode"]

    with chart, helm.Config(kubeconfig_path=args.kubeconfig, namespace=args.namespace) as cfg:
        try:
            cfg.check_reachable()
        except helm.HelmError as e:
            die("reaching the API server", str(e), f"check --kubeconfig {args.kubeconfig}")

        try:
            existing = cfg.status(args.release)
        except helm.HelmNotFoundError:
            existing = None
        except helm.HelmError as e:
            die(f"looking up release {args.release}", str(e))
        if existing is not None:
            die(f"installing release {args.release}",
                f"release {args.release} already exists in namespace {args.namespace} "
                f"(status {existing.get('info', {}).get('status') or existing.get('status')})",
                f"uninstall it first (helm uninstall {args.release} -n {args.namespace}) or pass another --release")

        print(f"==> server-side dry run of release {args.release} in namespace {args.namespace}", file=sys.stderr)
        try:
            dry = cfg.install(chart, args.release, values, namespace=args.namespace, dry_run="server",
                              create_namespace=True, timeout=args.timeout)
        except helm.HelmError as e:
            die("the server-side dry run (the API server rejected an object, or the chart did not render)", str(e))
        dry_objs = objects_of(dry.get("manifest", ""))
        if not dry_objs:
            die("the server-side dry run", "the release rendered no objects")
        print(f"    {len(dry_objs)} objects accepted by the API server", file=sys.stderr)

        print(f"==> installing release {args.release}", file=sys.stderr)
        try:
            rel = cfg.install(chart, args.release, values, namespace=args.namespace,
                              create_namespace=True, timeout=args.timeout)
        except helm.HelmError as e:
            die("the install", str(e),
                f"inspect with kubectl; remove the failed release before retrying (helm uninstall {args.release} -n {args.namespace})")
        objs = objects_of(rel.get("manifest", ""))
        status = rel.get("info", {}).get("status") or rel.get("status")
        if status != "deployed":
            die("the install", f"release status is {status!r}, not 'deployed': {json.dumps(rel.get('info', {}))}")

        print(f"\nrelease {args.release} (revision {rel.get('version') or rel.get('revision')}), objects:")
        for o in objs:
            print(f"  {describe(o, args.namespace)}")

        if kubectl:
            missing = []
            for o in objs:
                try:
                    kubectl_get(kubectl, args.kubeconfig, o, args.namespace)
                except Exception as e:  # noqa: BLE001 - reported below
                    missing.append(f"{describe(o, args.namespace)}: {e}")
            if missing:
                die("checking the installed objects", "\n  ".join(missing))
            print(f"    all {len(objs)} objects found in the cluster with kubectl", file=sys.stderr)
        else:
            print("    note: kubectl not found; the objects were not looked up after the install", file=sys.stderr)

        if args.verify_upgrade:
            if not kubectl:
                die("--verify-upgrade", "needs kubectl to read the live Secret and webhook configurations")
            before = tls_state(kubectl, args.kubeconfig, objs, args.namespace)
            print(f"==> upgrading release {args.release} with the same values (--verify-upgrade)", file=sys.stderr)
            try:
                up = cfg.upgrade(chart, args.release, values, namespace=args.namespace, timeout=args.timeout)
            except helm.HelmError as e:
                die("the upgrade (--verify-upgrade)", str(e))
            after = tls_state(kubectl, args.kubeconfig, objects_of(up.get("manifest", "")), args.namespace)
            changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            if changed:
                die("--verify-upgrade", "the upgrade changed certificate material: " + ", ".join(changed))
            print(f"    upgrade kept the certificates and caBundles ({len(after)} checked)", file=sys.stderr)
            if mode != "certManager":
                empty = sorted(k for k, v in after.items() if not v)
                if empty:
                    die("--verify-upgrade", "no certificate material in: " + ", ".join(empty))

    sa = next((o for o in objs if o["kind"] == "ServiceAccount"), None)
    if sa is not None:
        print(f"serviceaccount={args.namespace}/{sa['metadata']['name']}")
    print(f"release={args.release} status={status} revision={rel.get('version') or rel.get('revision')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
