"""End-to-end tests against real sidecars, run by graceguard's test bed
(tests/tests/e2e/sidecar_api.rs), which starts the sidecars and a kubelet that
ends each pod a moment after it runs (annotation testbed.graceguard.io/end:
Succeeded, Failed or never) and sets GRACEGUARD_E2E_NAMESPACE,
GRACEGUARD_E2E_TEMPLATE, GRACEGUARD_E2E_SOCKET, GRACEGUARD_E2E_URL and
GRACEGUARD_E2E_TOKEN_FILE."""

import copy
import json
import os
import time
from typing import Any, Dict, Tuple

import pytest

from graceguard_client import (
    CLEANUP_PENDING,
    EPOCH_CHANGED,
    NOT_ENDED,
    NOT_FOUND,
    SPEC_CONFLICT,
    TEMPLATE_CONFLICT,
    Client,
    Cursor,
    ResultEvent,
    SidecarError,
)


def env(name: str) -> str:
    v = os.environ.get(name)
    if not v:
        pytest.fail(f"{name} is not set: run these tests through graceguard's scripts/test (tests/tests/e2e/sidecar_api.rs)")
    return v


def template(end: str, image: str = "") -> Dict[str, Any]:
    with open(env("GRACEGUARD_E2E_TEMPLATE")) as f:
        pod: Dict[str, Any] = json.load(f)
    pod = copy.deepcopy(pod)
    pod.setdefault("metadata", {})["annotations"] = {"testbed.graceguard.io/end": end}
    if image:
        pod["spec"]["containers"][0]["image"] = image
    return pod


def client(transport: str) -> Client:
    if transport == "socket":
        return Client(socket=env("GRACEGUARD_E2E_SOCKET"))
    with open(env("GRACEGUARD_E2E_TOKEN_FILE")) as f:
        return Client(url=env("GRACEGUARD_E2E_URL"), token=f.read().strip())


def result(c: Client, ns: str, task: str, attempt: int) -> Tuple[ResultEvent, Cursor]:
    cur = c.cursor()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for e in cur.next(wait=5).events:
            if isinstance(e, ResultEvent) and (e.namespace, e.task) == (ns, task) and e.outcome.attempts == attempt + 1:
                return e, cur
    pytest.fail(f"no result of {task} attempt {attempt} within 120 s")


def wait_phase(c: Client, ns: str, task: str, phase: str) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if c.get_task(ns, task).phase == phase:
            return
        time.sleep(0.2)
    pytest.fail(f"{task} never reached {phase}")


def refused(reason: str, call: Any, *args: Any, **kw: Any) -> None:
    with pytest.raises(SidecarError) as e:
        call(*args, **kw)
    assert e.value.reason == reason, e.value


@pytest.mark.parametrize("transport", ["socket", "tcp"])
def test_every_call(transport: str) -> None:
    ns = env("GRACEGUARD_E2E_NAMESPACE")
    c = client(transport)
    h = c.health()
    assert h["synced"] and h["holds_lease"], h
    ok, fail, never = f"py-{transport}-ok", f"py-{transport}-fail", f"py-{transport}-abort"
    tpl = template("Succeeded")

    status, created = c.put_task(ns, ok, tpl)
    assert created and status.pod == f"{ok}-0"
    assert c.put_task(ns, ok, tpl)[1] is False
    refused(SPEC_CONFLICT, c.put_task, ns, ok, tpl, retries=2)
    other = template("Succeeded", "busybox:other")
    refused(TEMPLATE_CONFLICT, c.put_task, ns, ok, other)

    ev, cur = result(c, ns, ok, 0)
    assert ev.outcome.succeeded and ev.outcome.pod == f"{ok}-0"
    assert cur.ack(ev) == [{"seq": ev.seq, "marked": "done"}]
    refused(EPOCH_CHANGED, c.ack, "0000000000000000", seqs=[ev.seq])

    status, _ = c.put_task(ns, ok, other, replace=True)
    assert (status.attempt, status.pod) == (1, f"{ok}-1")
    ev, cur = result(c, ns, ok, 1)
    assert ev.outcome.succeeded and ev.outcome.pod == f"{ok}-1"
    cur.ack(ev)

    c.put_task(ns, fail, template("Failed"))
    ev, cur = result(c, ns, fail, 0)
    assert not ev.outcome.succeeded and ev.outcome.failure_kind == "user"
    cur.ack(ev)
    status = c.retry_task(ns, fail)
    assert (status.attempt, status.pod) == (1, f"{fail}-1")
    refused(NOT_ENDED, c.retry_task, ns, fail)
    ev, cur = result(c, ns, fail, 1)
    cur.ack(ev)

    c.put_task(ns, never, template("never"))
    wait_phase(c, ns, never, "Running")
    status = c.delete_task(ns, never)
    assert status.terminal and (status.reason or "").startswith("Aborted"), status

    page = c.list_tasks(ns, limit=1)
    assert len(page.items) == 1 and page.continue_token
    names = {t.task for t in c.all_tasks(ns)}
    assert {ok, fail, never} <= names, names

    deadline = time.monotonic() + 90
    while True:
        try:
            c.delete_task(ns, never, forget=True)
            break
        except SidecarError as e:
            if e.reason not in (CLEANUP_PENDING, NOT_ENDED) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    refused(NOT_FOUND, c.get_task, ns, never)
