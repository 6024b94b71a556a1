"""Rendered job status bodies, cached by the stored record they were made from.

`GET /jobs/{id}` is what every client polls, many times per job, while the record changes a few
times per job. The store returns the record's JSON unparsed; an unchanged string means an unchanged
answer, so the parsed record's tenant check and its rendered body are kept under that string and a
poll of an unchanged job costs one store round trip and a dictionary lookup — no pydantic
validation of the record, its config or its error, and no JSON encoding.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from autofusion_core.store import JobRecord

from .schemas import job_view


@dataclass
class StatusView:
    """What a status poll needs of one version of a record."""

    record: JobRecord
    _bodies: dict[bool, bytes] = field(default_factory=dict)

    @property
    def tenant(self) -> str:
        return self.record.tenant

    @property
    def terminal(self) -> bool:
        return self.record.terminal

    def waiting(self, served: set[str]) -> bool:
        """Queued for a target no live worker serves (shown as the stage `waiting_for_worker`)."""
        return self.record.status == "queued" and self.record.target not in served

    def body(self, waiting: bool) -> bytes:
        rendered = self._bodies.get(waiting)
        if rendered is None:
            rendered = job_view(self.record, waiting=waiting).model_dump_json().encode()
            self._bodies[waiting] = rendered
        return rendered


class StatusViews:
    """A bounded LRU map from a record's stored JSON to its `StatusView`."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, StatusView] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, raw: str) -> StatusView:
        with self._lock:
            view = self._entries.get(raw)
            if view is not None:
                self._entries.move_to_end(raw)
                return view
        view = StatusView(JobRecord.model_validate_json(raw))
        with self._lock:
            self._entries[raw] = view
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return view

    def __len__(self) -> int:
        return len(self._entries)
