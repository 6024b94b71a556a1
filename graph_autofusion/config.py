"""Fusion configuration: one pydantic model shared by the library, the CLI and the service.

The attribute names mirror the classic fuser API (`enable_auto_fusion`, `enable_pattern_matching`,
`enable_cost_model`, `cost_model`) so existing call sites keep working; the service accepts the
same model as JSON, so a job's config is validated exactly as a library call's is.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

CostModelName = Literal["memory_bandwidth", "compute_density", "latency"]


class ShapeConstraint(BaseModel):
    """A bound on one node's output shape in a declarative pattern."""

    model_config = ConfigDict(extra="forbid")

    rank: int | None = Field(default=None, ge=0, description="Exact rank of the output.")
    min_elements: int | None = Field(default=None, ge=0)
    max_elements: int | None = Field(default=None, ge=0)


class PatternStep(BaseModel):
    """One op of a declarative pattern: the op type plus optional attribute and shape constraints."""

    model_config = ConfigDict(extra="forbid")

    op: str = Field(description="ONNX op type, e.g. 'MatMul'; '*' matches any op.")
    attrs: dict[str, Any] = Field(default_factory=dict, description="Attribute values that must match.")
    shape: ShapeConstraint | None = None


class PatternSpec(BaseModel):
    """A declarative fusion pattern: a producer→consumer chain of ops fused into one kernel.

    This is what the service accepts over the wire (never code): the chain is matched along
    single-consumer edges, and each match is proposed as a group to the same legality check that
    built-in patterns go through.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
    sequence: list[PatternStep] = Field(min_length=1, max_length=64)
    priority: int = Field(default=0, description="Higher runs earlier among user patterns.")


class FusionConfig(BaseModel):
    """Everything that steers one fusion run.  Unknown keys are rejected, not ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enable_auto_fusion: bool = Field(default=True, description="Run strategy-driven greedy merging.")
    enable_pattern_matching: bool = Field(default=True, description="Apply built-in and user patterns.")
    enable_cost_model: bool = Field(
        default=True, description="Let the cost model decline legal fusions it predicts to be slower."
    )
    cost_model: CostModelName = "memory_bandwidth"
    hardware: str = Field(default="cpu", description="Hardware profile the cost model uses.")
    max_fusion_size: int = Field(default=64, ge=0, description="Ops per fused group; 0 disables fusion.")
    max_inputs: int = Field(
        default=8, ge=1, description="External inputs per fused group (weights excluded)."
    )
    max_rounds: int = Field(default=10, ge=1, description="Merge rounds of the auto-fusion strategy.")
    disabled_patterns: list[str] = Field(default_factory=list)
    patterns: list[PatternSpec] = Field(default_factory=list, description="Declarative user patterns.")
    input_shapes: dict[str, list[int]] = Field(
        default_factory=dict, description="Bind symbolic input dims, e.g. {'input_ids': [1, 128]}."
    )
    max_model_bytes: int = Field(default=2 * 1024**3, ge=1)
    max_nodes: int = Field(default=100_000, ge=1)
    max_activation_bytes: int = Field(
        default=8 * 1024**3,
        ge=1,
        description="Refuse (model_too_large) a model whose activations, at their peak in graph order, "
        "need more bytes than this; checked from static shapes before anything is allocated.",
    )
    allow_host_ops: bool = Field(
        default=True,
        description="Let ops the backend cannot compile run on the host (onnx.reference); False "
        "refuses such a model (host_op_refused) instead.",
    )

    @field_validator("input_shapes")
    @classmethod
    def _positive_dims(cls, value: dict[str, list[int]]) -> dict[str, list[int]]:
        for name, dims in value.items():
            if any(d <= 0 for d in dims):
                raise ValueError(f"input_shapes[{name!r}] has a non-positive dimension: {dims}")
        return value

    def canonical_json(self) -> str:
        """Deterministic JSON of every field (defaults included) — the basis of job keys."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()
