"""The sidecar API's objects as typed Python values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union


def _known(cls: Any, d: Dict[str, Any]) -> Dict[str, Any]:
    """The fields of `d` that dataclass `cls` has: a newer sidecar's extra
    fields are ignored, not an error."""
    return {k: v for k, v in d.items() if k in cls.__dataclass_fields__}


@dataclass(frozen=True)
class TaskStatus:
    """A task as the sidecar sees it."""

    namespace: str
    task: str
    attempt: int
    pod: str
    phase: str
    uid: Optional[str] = None
    reason: Optional[str] = None
    failure_kind: Optional[str] = None
    user_failures: int = 0
    system_failures: int = 0
    terminal: bool = False
    succeeded: Optional[bool] = None
    started: bool = False
    cleanup_pending: bool = False
    needs_template: bool = False

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "TaskStatus":
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class TaskList:
    items: List[TaskStatus]
    continue_token: Optional[str] = None


@dataclass(frozen=True)
class Outcome:
    """How a task ended."""

    succeeded: bool
    attempts: int
    pod: str
    user_failures: int = 0
    system_failures: int = 0
    failure_kind: Optional[str] = None
    reason: Optional[str] = None
    uid: Optional[str] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Outcome":
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class TransitionEvent:
    """A task's phase changed."""

    seq: int
    namespace: str
    task: str
    attempt: int
    pod: str
    phase: str
    reason: Optional[str] = None
    failure_kind: Optional[str] = None
    type: str = "transition"


@dataclass(frozen=True)
class ResultEvent:
    """A task ended; acknowledging it marks its pod done."""

    seq: int
    namespace: str
    task: str
    outcome: Outcome
    type: str = "result"


@dataclass(frozen=True)
class PodEvent:
    """A dead instance's pod: type "adopted" (completed, claimed for this
    instance) or "gone" (deleted before it was delivered)."""

    seq: int
    type: str
    namespace: str
    pod: str
    uid: str
    task: str
    instance: str
    phase: str
    resource_version: str
    attempt: Optional[int] = None
    reason: Optional[str] = None


@dataclass(frozen=True)
class UnknownEvent:
    """An event of a kind this client does not know (a newer sidecar)."""

    seq: int
    type: str
    body: Dict[str, Any] = field(default_factory=dict)


Event = Union[TransitionEvent, ResultEvent, PodEvent, UnknownEvent]


def event_from_json(d: Dict[str, Any]) -> Event:
    """Reads one event by its "type"."""
    kind = d.get("type", "")
    fields = {k: v for k, v in d.items() if k != "type"}
    if kind == "transition":
        return TransitionEvent(**_known(TransitionEvent, fields))
    if kind == "result":
        return ResultEvent(
            seq=d["seq"], namespace=d["namespace"], task=d["task"], outcome=Outcome.from_json(d["outcome"])
        )
    if kind in ("adopted", "gone"):
        return PodEvent(type=kind, **_known(PodEvent, fields))
    return UnknownEvent(seq=int(d.get("seq", 0)), type=str(kind), body=d)


@dataclass(frozen=True)
class Batch:
    """What one Cursor.next returned: the events, and whether the sidecar
    restarted since the last batch (submit your tasks again then)."""

    events: List[Event]
    restarted: bool = False
