"""Unit tests against a small in-process HTTP server (no sidecar)."""

import json
import os
import socket
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from typing import Any, Callable, Dict, Tuple

import pytest

from graceguard_client import (
    EPOCH_CHANGED,
    FENCED,
    NOT_ENDED,
    NOT_FOUND,
    UNAUTHORIZED,
    Client,
    MaybeApplied,
    PodEvent,
    ResultEvent,
    SidecarError,
    TransitionEvent,
    UnknownEvent,
    event_from_json,
)

Handler = Callable[[str, str, Dict[str, str]], Tuple[int, Any]]


def serve(answer: Handler) -> Tuple[HTTPServer, str]:
    class H(BaseHTTPRequestHandler):
        def _any(self) -> None:
            code, body = answer(self.command, self.path, dict(self.headers))
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_PUT = do_POST = do_DELETE = _any

        def log_message(self, *a: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def status(code: int, reason: str) -> Tuple[int, Any]:
    return code, {"kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": "m"}


def test_events_are_read_by_their_type() -> None:
    t = event_from_json({"seq": 1, "type": "transition", "namespace": "n", "task": "t", "attempt": 0, "pod": "t-0", "phase": "Running", "reason": None, "failure_kind": None})
    assert isinstance(t, TransitionEvent) and t.phase == "Running"
    r = event_from_json({"seq": 2, "type": "result", "namespace": "n", "task": "t", "outcome": {"succeeded": True, "attempts": 1, "pod": "t-0", "user_failures": 0, "system_failures": 0, "failure_kind": None, "reason": None, "uid": "u"}})
    assert isinstance(r, ResultEvent) and r.outcome.succeeded and r.outcome.pod == "t-0"
    g = event_from_json({"seq": 3, "type": "gone", "namespace": "n", "pod": "x-1", "uid": "u", "task": "x", "attempt": 1, "instance": "dead", "phase": "Running", "reason": "Deleted", "resource_version": "9"})
    assert isinstance(g, PodEvent) and g.type == "gone" and g.attempt == 1
    u = event_from_json({"seq": 4, "type": "from_the_future"})
    assert isinstance(u, UnknownEvent) and u.seq == 4


def test_a_refusal_raises_with_its_reason_and_the_token_is_sent() -> None:
    def answer(method: str, path: str, headers: Dict[str, str]) -> Tuple[int, Any]:
        if headers.get("Authorization") != "Bearer s3cret":
            return status(401, UNAUTHORIZED)
        return status(404, NOT_FOUND)

    srv, url = serve(answer)
    try:
        with pytest.raises(SidecarError) as e:
            Client(url=url, token="s3cret").get_task("n", "t")
        assert (e.value.code, e.value.reason) == (404, NOT_FOUND)
        with pytest.raises(SidecarError) as e:
            Client(url=url, token="wrong").get_task("n", "t")
        assert e.value.reason == UNAUTHORIZED
        with pytest.raises(ValueError):
            Client()
    finally:
        srv.shutdown()


def test_a_call_is_retried_until_the_sidecar_listens_but_a_refusal_is_not() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    calls = []

    def answer(method: str, path: str, headers: Dict[str, str]) -> Tuple[int, Any]:
        calls.append(path)
        if path.endswith("/retry"):
            return status(409, NOT_ENDED)
        return 200, {"namespace": "n", "task": "t", "attempt": 0, "pod": "t-0", "phase": "Queued"}

    def late() -> None:
        time.sleep(0.3)
        class Late(ThreadingHTTPServer):
            allow_reuse_address = True
        srv, _ = serve(answer)  # a throwaway, to reuse its handler class
        handler = srv.RequestHandlerClass
        srv.shutdown()
        Late(("127.0.0.1", port), handler).serve_forever()

    threading.Thread(target=late, daemon=True).start()
    c = Client(url=f"http://127.0.0.1:{port}", first_backoff=0.05)
    assert c.get_task("n", "t").pod == "t-0"
    before = len(calls)
    with pytest.raises(SidecarError) as e:
        c.retry_task("n", "t")
    assert e.value.reason == NOT_ENDED and len(calls) == before + 1


def test_a_broken_post_is_not_repeated_but_a_get_is() -> None:
    calls: Dict[str, int] = {}

    class H(BaseHTTPRequestHandler):
        def _any(self) -> None:
            calls[self.command] = calls.get(self.command, 0) + 1
            if calls[self.command] == 1:
                # Read, then hang up without an answer.
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            raw = json.dumps({"namespace": "n", "task": "t", "attempt": 1, "pod": "t-1", "phase": "Queued"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_POST = _any

        def log_message(self, *a: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    c = Client(url=f"http://127.0.0.1:{srv.server_address[1]}", first_backoff=0.01)
    with pytest.raises(MaybeApplied):
        c.retry_task("n", "t")
    assert calls["POST"] == 1
    assert c.get_task("n", "t").pod == "t-1"
    assert calls["GET"] == 2
    srv.shutdown()


def test_a_cursor_says_when_the_sidecar_restarted() -> None:
    epoch = {"now": "e1"}

    def answer(method: str, path: str, headers: Dict[str, str]) -> Tuple[int, Any]:
        if "after=0" not in path and f"epoch={epoch['now']}" not in path:
            return status(409, EPOCH_CHANGED)
        ev = {"seq": 5, "type": "transition", "namespace": "n", "task": "t", "attempt": 0, "pod": "t-0", "phase": "Queued"}
        return 200, {"events": [ev], "last_seq": 5, "epoch": epoch["now"]}

    srv, url = serve(answer)
    try:
        cur = Client(url=url).cursor()
        b = cur.next(wait=0)
        assert (len(b.events), b.restarted, cur.epoch) == (1, False, "e1")
        epoch["now"] = "e2"
        b = cur.next(wait=0)
        assert (b.events, b.restarted, cur.epoch) == ([], True, None)
        b = cur.next(wait=0)
        assert (len(b.events), b.restarted, cur.epoch) == (1, False, "e2")
    finally:
        srv.shutdown()


def test_a_cursor_never_skips_an_event_it_could_not_acknowledge() -> None:
    """A sidecar's event log in miniature: events stay until acknowledged;
    `fail_acks` makes the next acknowledgements answer 503 Fenced."""
    log: Dict[str, Any] = {"held": [1, 2, 3], "fail_acks": 0}

    class H(BaseHTTPRequestHandler):
        def _answer(self, code: int, body: Any) -> None:
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_POST(self) -> None:
            seqs = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["seqs"]
            if log["fail_acks"]:
                log["fail_acks"] -= 1
                self._answer(*status(503, FENCED))
                return
            log["held"] = [s for s in log["held"] if s not in seqs]
            self._answer(200, {"acked": []})

        def do_GET(self) -> None:
            after = int(urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["after"][0])
            evs = [{"seq": s, "type": "transition", "namespace": "n", "task": "t", "attempt": 0, "pod": "t-0", "phase": "Queued"} for s in log["held"] if s > after]
            self._answer(200, {"events": evs, "last_seq": 3, "epoch": "e1"})

        def log_message(self, *a: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        cur = Client(url=f"http://127.0.0.1:{srv.server_address[1]}").cursor()
        evs = cur.next(wait=0).events
        assert [e.seq for e in evs] == [1, 2, 3]
        cur.ack(evs[0])
        assert cur.unacknowledged == 2
        # The acknowledgement of 2 fails: 2 and 3 (returned, not
        # acknowledged) come again; 1 does not.
        log["fail_acks"] = 1
        with pytest.raises(SidecarError) as e:
            cur.ack(evs[1])
        assert e.value.reason == FENCED
        evs = cur.next(wait=0).events
        assert [e.seq for e in evs] == [2, 3]
        # The caller acknowledges 3 and rewinds for what it could not handle.
        cur.ack(evs[1])
        cur.rewind()
        evs = cur.next(wait=0).events
        assert [e.seq for e in evs] == [2]
        cur.ack(*evs)
        assert cur.unacknowledged == 0
        cur.rewind()
        assert cur.next(wait=0).events == []
    finally:
        srv.shutdown()
