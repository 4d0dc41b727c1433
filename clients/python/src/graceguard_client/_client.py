"""The HTTP side: one request per call over a Unix socket or loopback TCP,
retried with exponential backoff while the sidecar cannot be reached."""

from __future__ import annotations

import http.client
import json
import socket as _socket
import time
import urllib.parse
from typing import Any, Dict, Iterable, List, Optional, Set

from ._types import Batch, Event, TaskList, TaskStatus, event_from_json

# Reasons a client acts on (an error's `reason`).
NOT_FOUND = "NotFound"
TEMPLATE_CONFLICT = "TemplateConflict"
SPEC_CONFLICT = "SpecConflict"
NOT_ENDED = "NotEnded"
CLEANUP_PENDING = "CleanupPending"
EPOCH_CHANGED = "EpochChanged"
FENCED = "Fenced"
NOT_SYNCED = "NotSynced"
# The sidecar holds as many tasks (or bytes of templates) as it may: forget
# ended tasks, then submit again.
TOO_MANY_TASKS = "TooManyTasks"
UNAUTHORIZED = "Unauthorized"


class SidecarError(Exception):
    """The sidecar refused a request: `code` is the HTTP status, `reason` a
    word to switch on (NOT_FOUND, EPOCH_CHANGED, ...), `message` what to do."""

    def __init__(self, code: int, body: Any) -> None:
        self.code = code
        if isinstance(body, dict) and "reason" in body:
            self.reason = str(body["reason"])
            self.message = str(body.get("message", ""))
        else:
            self.reason = http.client.responses.get(code, "Error")
            self.message = body if isinstance(body, str) else json.dumps(body)
        super().__init__(f"graceguard sidecar: HTTP {code} {self.reason}: {self.message}")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


# Failures that mean the request never reached a sidecar.
_UNREACHABLE = (ConnectionRefusedError, FileNotFoundError, ConnectionResetError, http.client.RemoteDisconnected)
# Of those, the ones that mean the request never left: nothing listened.
_NEVER_SENT = (ConnectionRefusedError, FileNotFoundError)


class MaybeApplied(ConnectionError):
    """A task's retry (POST …/retry) whose connection broke after it was
    sent: the sidecar may have applied it. Read the task's status before
    sending it again."""


def _repeatable(method: str, path: str) -> bool:
    """Whether a call may be sent again after its connection broke: all but
    a task's retry, which would run it twice (an acknowledgement names its
    epoch and sequence numbers)."""
    return method != "POST" or path == "/v1/events/ack"


class Client:
    """Talks to one sidecar: `Client(socket=PATH)` or `Client(url=URL, token=T)`.

    Calls that cannot connect are retried `connect_retries` times with
    exponential backoff (from `first_backoff` seconds, doubling, at most 5 s;
    the default 16 is about 56 s, longer than a failover). A call whose
    connection broke mid-call is retried too when it is safe to repeat (GET,
    PUT, DELETE, an acknowledgement); a task's retry only if it was never
    sent, else MaybeApplied is raised. Refusals raise SidecarError.
    """

    def __init__(
        self,
        socket: Optional[str] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: float = 90.0,
        connect_retries: int = 16,
        first_backoff: float = 0.1,
    ) -> None:
        if (socket is None) == (url is None):
            raise ValueError("give exactly one of socket= or url=")
        self._socket = socket
        self._url = urllib.parse.urlsplit(url) if url else None
        if self._url is not None and (self._url.scheme != "http" or not self._url.hostname):
            raise ValueError(f"url {url!r} is not an http://host:port address")
        self._token = token
        self._timeout = timeout
        self._retries = connect_retries
        self._backoff = first_backoff

    def _connection(self) -> http.client.HTTPConnection:
        if self._socket:
            return _UnixConnection(self._socket, self._timeout)
        assert self._url is not None and self._url.hostname is not None
        return http.client.HTTPConnection(self._url.hostname, self._url.port, timeout=self._timeout)

    def _once(self, method: str, path: str, data: Optional[bytes]) -> "tuple[int, Any]":
        headers = {"Accept": "application/json"}
        if data is not None:
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
            parsed: Any = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        if resp.status >= 400:
            raise SidecarError(resp.status, parsed)
        return resp.status, parsed

    def request(self, method: str, path: str, body: Any = None) -> "tuple[int, Any]":
        """One call: (HTTP status, parsed JSON answer)."""
        data = None if body is None else json.dumps(body).encode()
        wait = self._backoff
        for attempt in range(self._retries + 1):
            try:
                return self._once(method, path, data)
            except _UNREACHABLE as e:
                if not _repeatable(method, path) and not isinstance(e, _NEVER_SENT):
                    raise MaybeApplied(
                        f"{method} {path}: the connection broke after the request was sent ({e!r}); "
                        "it may have taken effect: read the task's status before repeating it"
                    ) from e
                if attempt == self._retries:
                    raise
                time.sleep(wait)
                wait = min(wait * 2, 5.0)
        raise AssertionError("unreachable")

    @staticmethod
    def _task_path(namespace: str, task: str) -> str:
        q = urllib.parse.quote
        return f"/v1/tasks/{q(namespace, safe='')}/{q(task, safe='')}"

    def put_task(
        self,
        namespace: str,
        task: str,
        template: Dict[str, Any],
        retries: int = 0,
        max_system_failures: int = 3,
        bounds: Optional[Dict[str, Any]] = None,
        rerun_done: bool = False,
        replace: bool = False,
    ) -> "tuple[TaskStatus, bool]":
        """Submits a task: (its status, whether this call created it). Another
        template or settings raise TEMPLATE_CONFLICT or SPEC_CONFLICT; with
        `replace`, an ended task is run anew under the name after its last."""
        body: Dict[str, Any] = {"template": template, "retries": retries, "max_system_failures": max_system_failures}
        if bounds:
            body["bounds"] = bounds
        if rerun_done:
            body["rerun_done"] = True
        path = self._task_path(namespace, task) + ("?replace=true" if replace else "")
        code, answer = self.request("PUT", path, body)
        return TaskStatus.from_json(answer), code == 201

    def get_task(self, namespace: str, task: str) -> TaskStatus:
        return TaskStatus.from_json(self.request("GET", self._task_path(namespace, task))[1])

    def list_tasks(
        self, namespace: Optional[str] = None, limit: Optional[int] = None, continue_token: Optional[str] = None
    ) -> TaskList:
        """One page of the tasks the sidecar knows, in (namespace, task) order."""
        q: Dict[str, Any] = {}
        if namespace:
            q["namespace"] = namespace
        if limit:
            q["limit"] = limit
        if continue_token:
            q["continue"] = continue_token
        _, answer = self.request("GET", "/v1/tasks?" + urllib.parse.urlencode(q))
        return TaskList(
            items=[TaskStatus.from_json(t) for t in answer["items"]], continue_token=answer.get("continue")
        )

    def all_tasks(self, namespace: Optional[str] = None) -> List[TaskStatus]:
        """Every page of list_tasks: what an executor resyncs from after its restart."""
        out: List[TaskStatus] = []
        token: Optional[str] = None
        while True:
            page = self.list_tasks(namespace, continue_token=token)
            out.extend(page.items)
            if not page.continue_token:
                return out
            token = page.continue_token

    def retry_task(self, namespace: str, task: str) -> TaskStatus:
        return TaskStatus.from_json(self.request("POST", self._task_path(namespace, task) + "/retry")[1])

    def delete_task(self, namespace: str, task: str, forget: bool = False) -> TaskStatus:
        """Aborts a task; with `forget`, forgets it once it has ended
        (CLEANUP_PENDING or NOT_ENDED while a pod of it still runs: ask again)."""
        path = self._task_path(namespace, task) + ("?forget=true" if forget else "")
        return TaskStatus.from_json(self.request("DELETE", path)[1])

    def events(self, after: int = 0, wait: int = 0, limit: int = 500, epoch: Optional[str] = None) -> Dict[str, Any]:
        """Raw events after `after` (of `epoch`, required when after > 0). Prefer a Cursor."""
        q: Dict[str, Any] = {"after": after, "wait": wait, "limit": limit}
        if epoch is not None:
            q["epoch"] = epoch
        answer: Dict[str, Any] = self.request("GET", f"/v1/events?{urllib.parse.urlencode(q)}")[1]
        return answer

    def ack(self, epoch: str, seq: Optional[int] = None, seqs: Optional[Iterable[int]] = None) -> List[Dict[str, Any]]:
        """Acknowledges, in `epoch`, every event up to `seq` or exactly `seqs`."""
        if (seq is None) == (seqs is None):
            raise ValueError("give exactly one of seq= or seqs=")
        body: Dict[str, Any] = {"epoch": epoch}
        if seq is not None:
            body["seq"] = seq
        else:
            body["seqs"] = list(seqs or [])
        acked: List[Dict[str, Any]] = self.request("POST", "/v1/events/ack", body)[1]["acked"]
        return acked

    def health(self) -> Dict[str, Any]:
        """/healthz (a 503 answer, not synced yet, is returned too)."""
        try:
            answer: Dict[str, Any] = self.request("GET", "/healthz")[1]
            return answer
        except SidecarError as e:
            if e.code == 503:
                parsed: Dict[str, Any] = json.loads(e.message)
                return parsed
            raise

    def cursor(self, limit: int = 500) -> "Cursor":
        return Cursor(self, limit)


class Cursor:
    """Follows the sidecar's events, carrying the epoch their sequence
    numbers belong to; tells you when the sidecar restarted. It remembers
    which events it returned that were not acknowledged yet, so none is
    skipped for good: an `ack` that fails, or `rewind()`, makes them come
    again (the sidecar keeps an event until it is acknowledged)."""

    def __init__(self, client: Client, limit: int = 500) -> None:
        self._c = client
        self._after = 0
        self._epoch: Optional[str] = None
        self._limit = limit
        # Returned by next(), not acknowledged through this cursor.
        self._pending: Set[int] = set()

    @property
    def epoch(self) -> Optional[str]:
        return self._epoch

    @property
    def unacknowledged(self) -> int:
        """How many events next() returned that no ack through this cursor
        has acknowledged yet."""
        return len(self._pending)

    def next(self, wait: int = 20) -> Batch:
        """Events after the last ones returned, waiting up to `wait` seconds.
        `restarted`: the sidecar restarted; the cursor starts over from its
        oldest event: submit your tasks again (they resume from their pods)."""
        try:
            page = self._c.events(after=self._after, wait=wait, limit=self._limit, epoch=self._epoch)
        except SidecarError as e:
            if e.reason != EPOCH_CHANGED:
                raise
            self._start_over()
            return Batch(events=[], restarted=True)
        restarted = self._epoch is not None and page["epoch"] != self._epoch
        if restarted:
            self._pending.clear()
        self._epoch = page["epoch"]
        events: List[Event] = [event_from_json(e) for e in page["events"]]
        self._pending.update(e.seq for e in events)
        if events:
            self._after = events[-1].seq
        return Batch(events=events, restarted=restarted)

    def rewind(self) -> None:
        """The next next() starts again from the oldest event this cursor
        returned and nobody acknowledged through it: call it when handling
        events failed part way. Events acknowledged meanwhile by anyone are
        gone from the sidecar and do not come again."""
        if self._pending:
            self._after = min(self._pending) - 1
            self._pending.clear()

    def ack(self, *events: Event) -> List[Dict[str, Any]]:
        """Acknowledges exactly these events. After a sidecar restart this
        raises EPOCH_CHANGED and marks nothing: the results come again. Any
        other failure rewinds the cursor (`rewind()`), so what it could not
        acknowledge comes again from the next next() instead of being
        skipped."""
        if not events:
            return []
        seqs = [e.seq for e in events]
        try:
            acked = self._c.ack(self._epoch or "", seqs=seqs)
        except SidecarError as e:
            if e.reason == EPOCH_CHANGED:
                self._start_over()
            else:
                self.rewind()
            raise
        except OSError:
            self.rewind()
            raise
        self._pending.difference_update(seqs)
        return acked

    def _start_over(self) -> None:
        self._after, self._epoch = 0, None
        self._pending.clear()
