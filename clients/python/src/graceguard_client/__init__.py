"""A client of graceguard's sidecar API (`graceguard sidecar`), standard
library only::

    from graceguard_client import Client
    c = Client(socket="/run/graceguard.sock")      # or url=..., token=...
    status, created = c.put_task("team-a", "train", template, retries=2)
    cur = c.cursor()
    while True:
        batch = cur.next(wait=20)
        if batch.restarted:                         # the sidecar restarted
            c.put_task("team-a", "train", template, retries=2)
        for e in batch.events:
            ...
            cur.ack(e)                              # results: pod marked done
"""

from ._client import (
    CLEANUP_PENDING,
    EPOCH_CHANGED,
    FENCED,
    NOT_ENDED,
    NOT_FOUND,
    NOT_SYNCED,
    SPEC_CONFLICT,
    TEMPLATE_CONFLICT,
    TOO_MANY_TASKS,
    UNAUTHORIZED,
    Client,
    Cursor,
    MaybeApplied,
    SidecarError,
)
from ._types import (
    Batch,
    Event,
    Outcome,
    PodEvent,
    ResultEvent,
    TaskList,
    TaskStatus,
    TransitionEvent,
    UnknownEvent,
    event_from_json,
)

__all__ = [
    "CLEANUP_PENDING",
    "EPOCH_CHANGED",
    "FENCED",
    "NOT_ENDED",
    "NOT_FOUND",
    "NOT_SYNCED",
    "SPEC_CONFLICT",
    "TEMPLATE_CONFLICT",
    "TOO_MANY_TASKS",
    "UNAUTHORIZED",
    "Batch",
    "Client",
    "MaybeApplied",
    "Cursor",
    "Event",
    "Outcome",
    "PodEvent",
    "ResultEvent",
    "SidecarError",
    "TaskList",
    "TaskStatus",
    "TransitionEvent",
    "UnknownEvent",
    "event_from_json",
]
