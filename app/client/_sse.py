"""Reading a ``text/event-stream`` (Server-Sent Events, the WHATWG HTML standard, section 9.2)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator


@dataclasses.dataclass(frozen=True)
class ServerSentEvent:
    """One event: its ``id`` (empty when it had none), its type, and its data lines joined by newlines."""

    id: str
    event: str
    data: str


def parse_sse(lines: Iterable[str]) -> Iterator[ServerSentEvent]:
    """The events of a stream given as lines; comments, ``retry`` and events without data are skipped."""
    event_id, kind = "", "message"
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield ServerSentEvent(event_id, kind, "\n".join(data))
            event_id, kind, data = "", "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            event_id = value
        elif name == "event":
            kind = value
        elif name == "data":
            data.append(value)
