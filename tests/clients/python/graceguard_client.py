"""A client of `graceguard sidecar`, standard library only.

Usage as a library:

    c = Client(socket="/run/graceguard.sock")          # or url=..., token=...
    c.put_task("team-a", "train", template, retries=2)
    batch = c.events(after=0, wait=20)                   # long poll
    for event in batch["events"]:
        ...
        c.ack(batch["epoch"], seqs=[event["seq"]])       # or seq=N: all up to N
    batch = c.events(after=last_seq, epoch=batch["epoch"], wait=20)

Sequence numbers belong to batch["epoch"]: a read after a sequence number
and every acknowledgement name it, and the sidecar answers 409
`epoch_changed` once it has restarted (its numbering starts anew): poll from
after=0 again (with no epoch) and submit the tasks again (a PUT is idempotent).

Usage as a command (what the end-to-end tests drive):

    graceguard_client.py --socket S run NS TASK TEMPLATE.json [--retries N]
        PUTs the task, prints each event of it as a JSON line, acknowledges
        its result and prints {"final": <status>} last.
    graceguard_client.py --socket S status NS TASK
    graceguard_client.py --socket S adopt --count N [--batch B]
        Syncs (one long poll each) until N adopted results were acknowledged;
        prints {"syncs": S, "delivered": [...]} with every pod delivered.
"""

import argparse
import http.client
import json
import socket
import sys
import urllib.parse


class SidecarError(Exception):
    """The sidecar refused a request; `code` is its error code."""

    def __init__(self, status, body):
        self.status = status
        self.code = body.get("code", "") if isinstance(body, dict) else ""
        message = body.get("error", body) if isinstance(body, dict) else body
        super().__init__(f"HTTP {status} {self.code}: {message}")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


class Client:
    def __init__(self, socket=None, url=None, token=None, timeout=90):
        if (socket is None) == (url is None):
            raise ValueError("give exactly one of socket= or url=")
        self._socket = socket
        self._url = urllib.parse.urlsplit(url) if url else None
        self._token = token
        self._timeout = timeout

    def _connection(self):
        if self._socket:
            return _UnixConnection(self._socket, self._timeout)
        return http.client.HTTPConnection(self._url.hostname, self._url.port, timeout=self._timeout)

    def request(self, method, path, body=None):
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        conn = self._connection()
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        if resp.status >= 400:
            raise SidecarError(resp.status, parsed)
        return parsed

    @staticmethod
    def _task_path(namespace, task):
        q = urllib.parse.quote
        return f"/v1/tasks/{q(namespace, safe='')}/{q(task, safe='')}"

    def put_task(self, namespace, task, template, retries=0, max_system_failures=3, bounds=None):
        body = {"template": template, "retries": retries, "max_system_failures": max_system_failures}
        if bounds:
            body["bounds"] = bounds
        return self.request("PUT", self._task_path(namespace, task), body)

    def get_task(self, namespace, task):
        return self.request("GET", self._task_path(namespace, task))

    def retry_task(self, namespace, task):
        return self.request("POST", self._task_path(namespace, task) + "/retry")

    def delete_task(self, namespace, task):
        return self.request("DELETE", self._task_path(namespace, task))

    def events(self, after=0, wait=0, limit=500, epoch=None):
        """Events after `after` (of `epoch`, required when after > 0)."""
        q = {"after": after, "wait": wait, "limit": limit}
        if epoch is not None:
            q["epoch"] = epoch
        return self.request("GET", f"/v1/events?{urllib.parse.urlencode(q)}")

    def ack(self, epoch, seq=None, seqs=None):
        """Acknowledge, in `epoch`, every event up to `seq` or exactly `seqs`."""
        if (seq is None) == (seqs is None):
            raise ValueError("give exactly one of seq= or seqs=")
        body = {"epoch": epoch}
        if seq is not None:
            body["seq"] = seq
        else:
            body["seqs"] = list(seqs)
        return self.request("POST", "/v1/events/ack", body)

    def health(self):
        return self.request("GET", "/healthz")


def _emit(obj):
    print(json.dumps(obj), flush=True)


def _run(c, args):
    with open(args.template) as f:
        template = json.load(f)
    status = c.put_task(args.namespace, args.task, template, retries=args.retries)
    _emit({"put": status})
    after, epoch = 0, None
    while True:
        try:
            batch = c.events(after=after, wait=20, epoch=epoch)
        except SidecarError as e:
            if e.code != "epoch_changed":
                raise
            # The sidecar restarted: read its log from the start, and submit
            # the task again (idempotent; it resumes from its pods).
            after, epoch = 0, None
            _emit({"put": c.put_task(args.namespace, args.task, template, retries=args.retries)})
            continue
        epoch = batch["epoch"]
        for e in batch["events"]:
            after = e["seq"]
            if e.get("namespace") != args.namespace or e.get("task") != args.task:
                continue
            _emit(e)
            if e["type"] == "result":
                # Only our own result: the log may hold other callers' events.
                c.ack(epoch, seqs=[e["seq"]])
                _emit({"final": c.get_task(args.namespace, args.task)})
                return 0


def _adopt(c, args):
    delivered, syncs, after, epoch = [], 0, 0, None
    while len(delivered) < args.count:
        try:
            batch = c.events(after=after, wait=5, limit=args.batch, epoch=epoch)
        except SidecarError as e:
            if e.code != "epoch_changed":
                raise
            # A new sidecar: its numbering starts anew.
            after, epoch = 0, None
            continue
        epoch = batch["epoch"]
        syncs += 1
        mine, got = [], []
        for e in batch["events"]:
            after = e["seq"]
            if e["type"] in ("adopted", "gone"):
                mine.append(e["seq"])
            if e["type"] == "adopted":
                got.append(e["pod"])
        if mine:
            try:
                c.ack(epoch, seqs=mine)
            except SidecarError as e:
                if e.code != "epoch_changed":
                    raise
                # Not acknowledged: the new sidecar delivers them again.
                after, epoch = 0, None
                continue
        delivered.extend(got)
        if syncs > args.max_syncs:
            break
    _emit({"syncs": syncs, "delivered": delivered})
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    c = Client(socket=args.socket, url=args.url, token=token)
    try:
        if args.cmd == "run":
            return _run(c, args)
        if args.cmd == "status":
            _emit(c.get_task(args.namespace, args.task))
            return 0
        return _adopt(c, args)
    except (SidecarError, OSError) as e:
        print(f"graceguard_client: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
