"""Planning: which operators run together as one kernel, and why others do not."""

from .patterns import DeclarativePattern, Pattern, builtin_patterns
from .planner import Plan, PlannedGroup, Refusal, plan
from .reasons import REASONS

__all__ = [
    "REASONS",
    "DeclarativePattern",
    "Pattern",
    "Plan",
    "PlannedGroup",
    "Refusal",
    "builtin_patterns",
    "plan",
]
