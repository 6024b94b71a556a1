"""The fusion configuration a job is submitted with, mirrored without importing the engine.

The service validates every config against the engine's own ``FusionConfig`` and answers
``invalid_config`` with the offending field, so this mirror only gives names, types and editor
completion; it deliberately repeats no bounds, and passes keys it does not know through to the
service (which rejects them) instead of deciding locally and drifting from the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CostModelName = Literal["memory_bandwidth", "compute_density", "latency"]


class FusionConfig(BaseModel):
    """Fields of the engine's ``graph_autofusion.FusionConfig``; only the ones you set are sent."""

    model_config = ConfigDict(extra="allow")

    enable_auto_fusion: bool = True
    enable_pattern_matching: bool = True
    enable_cost_model: bool = True
    cost_model: CostModelName = "memory_bandwidth"
    hardware: str = "cpu"
    max_fusion_size: int = 64
    max_inputs: int = 8
    max_rounds: int = 10
    disabled_patterns: list[str] = Field(default_factory=list)
    patterns: list[dict[str, Any]] = Field(default_factory=list)
    input_shapes: dict[str, list[int]] = Field(default_factory=dict)
    max_model_bytes: int = 2 * 1024**3
    max_nodes: int = 100_000
    max_activation_bytes: int = 8 * 1024**3
    allow_host_ops: bool = True


ConfigLike = FusionConfig | Mapping[str, Any] | BaseModel


def config_to_dict(config: ConfigLike | None) -> dict[str, Any] | None:
    """Normalize what a caller passed as config into the JSON object sent to the service.

    Accepts this module's `FusionConfig` (only explicitly set fields), the engine's own pydantic
    ``FusionConfig`` (duck-typed through ``model_dump``, so the engine need not be installed), or a
    plain mapping, which is sent as is so that the service is the single judge of its validity.
    """
    if config is None:
        return None
    if isinstance(config, FusionConfig):
        return config.model_dump(mode="json", exclude_unset=True)
    if isinstance(config, BaseModel):
        return config.model_dump(mode="json")
    if isinstance(config, Mapping):
        return dict(config)
    raise TypeError(f"config must be a FusionConfig or a mapping, not {type(config).__name__}")
