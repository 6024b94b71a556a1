"""Stable reason codes for a refused fusion: what a user reads when asking "why not fused?"."""

from __future__ import annotations

from dataclasses import dataclass

REASONS: dict[str, str] = {
    "NF001": "no shared data",
    "NF002": "would create a cycle",
    "NF003": "peak memory grows",
    "NF004": "size cap",
    "NF005": "input cap",
    "NF006": "loop domains differ",
    "NF007": "two anchors",
    "NF008": "cost model says slower",
    "NF009": "disabled by config",
    "NF010": "opaque op",
}


@dataclass(frozen=True)
class Verdict:
    """`ok` or a refusal with a stable `code` and a sentence naming the specifics."""

    ok: bool
    code: str = ""
    detail: str = ""

    @property
    def title(self) -> str:
        return REASONS.get(self.code, "")

    def __bool__(self) -> bool:
        return self.ok


ACCEPT = Verdict(True)


def refuse(code: str, detail: str) -> Verdict:
    assert code in REASONS, code
    return Verdict(False, code, detail)
