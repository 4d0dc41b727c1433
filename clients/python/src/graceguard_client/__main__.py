"""`python -m graceguard_client` (or `graceguard-client`): the client from the shell.

    graceguard-client --socket S run NS TASK TEMPLATE.json [--retries N]
        PUTs the task, prints each event of it as a JSON line, acknowledges
        its result and prints {"final": <status>} last.
    graceguard-client --socket S status NS TASK
    graceguard-client --socket S adopt --count N [--batch B]
        Syncs (one long poll each) until N adopted results were acknowledged;
        prints {"syncs": S, "delivered": [...]} with every pod delivered.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, List, Optional

from ._client import EPOCH_CHANGED, Client, SidecarError
from ._types import Event, PodEvent, ResultEvent


def _emit(obj: Any) -> None:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    print(json.dumps(obj), flush=True)


def _run(c: Client, args: argparse.Namespace) -> int:
    with open(args.template) as f:
        template = json.load(f)

    def put() -> None:
        status, _ = c.put_task(args.namespace, args.task, template, retries=args.retries)
        _emit({"put": dataclasses.asdict(status)})

    put()
    cur = c.cursor()
    while True:
        batch = cur.next(wait=20)
        if batch.restarted:
            put()
            continue
        for e in batch.events:
            if getattr(e, "namespace", None) != args.namespace or getattr(e, "task", None) != args.task:
                continue
            _emit(e)
            if isinstance(e, ResultEvent):
                # Only our own result: the log may hold other callers' events.
                cur.ack(e)
                _emit({"final": dataclasses.asdict(c.get_task(args.namespace, args.task))})
                return 0


def _adopt(c: Client, args: argparse.Namespace) -> int:
    delivered: List[str] = []
    syncs = 0
    cur = c.cursor(limit=args.batch)
    while len(delivered) < args.count and syncs <= args.max_syncs:
        batch = cur.next(wait=5)
        syncs += 1
        mine: List[Event] = [e for e in batch.events if isinstance(e, PodEvent)]
        if not mine:
            continue
        try:
            cur.ack(*mine)
        except SidecarError as e:
            if e.reason != EPOCH_CHANGED:
                raise
            # Not acknowledged: the new sidecar delivers them again.
            continue
        delivered.extend(e.pod for e in mine if isinstance(e, PodEvent) and e.type == "adopted")
    _emit({"syncs": syncs, "delivered": delivered})
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="graceguard-client", description="A client of graceguard's sidecar API.")
    p.add_argument("--socket")
    p.add_argument("--url")
    p.add_argument("--token-file")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("namespace")
    r.add_argument("task")
    r.add_argument("template")
    r.add_argument("--retries", type=int, default=0)
    s = sub.add_parser("status")
    s.add_argument("namespace")
    s.add_argument("task")
    a = sub.add_parser("adopt")
    a.add_argument("--count", type=int, required=True)
    a.add_argument("--batch", type=int, default=2)
    a.add_argument("--max-syncs", type=int, default=100000)
    args = p.parse_args(argv)
    token = None
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    try:
        c = Client(socket=args.socket, url=args.url, token=token)
        if args.cmd == "run":
            return _run(c, args)
        if args.cmd == "status":
            _emit(c.get_task(args.namespace, args.task))
            return 0
        return _adopt(c, args)
    except (SidecarError, OSError, ValueError) as e:
        print(f"graceguard-client: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
