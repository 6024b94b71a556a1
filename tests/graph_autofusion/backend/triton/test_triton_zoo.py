"""Every zoo model, at a small size, through the Triton renderer for both accelerator targets,
run in Triton's CPU interpreter and compared with onnxruntime under the project's verification
rule (graph_autofusion/verify.py). The Ascend variant is also held to the Ascend constraints:
grid within the AI cores, each block's working set within the Unified Buffer, no num_warps.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import graph_autofusion as gaf
from graph_autofusion.backend.triton.blocks import check_ascend
from graph_autofusion.hardware import get_profile

# The interpreter computes masked-off lanes too (0/0 there is discarded by the mask).
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

# zoo.TINY, smaller still where the interpreter pays per program (conv nets: one image).
SMALL: dict[str, dict[str, Any]] = {
    name: {**kw, **({"batch": 1} if name in ("resnet50", "mobilenet_v2", "vit_b16") else {})}
    for name, kw in gaf.zoo.TINY.items()
}
TARGETS = ("cuda", "ascend910")


@pytest.fixture(scope="module")
def fused_models() -> dict[str, gaf.FusedGraph]:
    return {name: gaf.fuse(gaf.zoo.build(name, **kw)) for name, kw in SMALL.items()}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(SMALL))
def test_zoo_model_matches_onnxruntime(name: str, target: str, fused_models, triton_cache) -> None:  # type: ignore[no-untyped-def]
    fused = fused_models[name]
    started = time.perf_counter()
    compiled = fused.compile(target=target, cache_dir=triton_cache)
    assert compiled.mode == "interpret"
    result = fused.verify(target=target)
    seconds = time.perf_counter() - started
    hosts = compiled.stats["host_ops"]
    print(f"{name} {target}: {compiled.stats['kernels']} kernels, {len(hosts)} host ops, {seconds:.1f} s")
    assert result.passed, [o.to_dict() for o in result.outputs if not o.passed]
    # Every group of the zoo renders: nothing falls back to the host.
    assert hosts == [], hosts
    assert fused.report()["targets"][target]["host_ops"] == []
    for kernel in compiled.kernels.values():
        largest = max(b.size for b in kernel.rendered.params)
        for launch, config in zip(kernel.rendered.launches, kernel.configs, strict=True):
            if launch.kind == "flat":  # one lane per point of the output, no program without work
                assert launch.extent <= largest, (kernel.symbol, launch.extent)
                assert (config.nblocks - 1) * config.meta["BLOCK"] < launch.extent
    if target == "ascend910":
        profile = get_profile("ascend910")
        for kernel in compiled.kernels.values():
            for config in kernel.configs:
                assert check_ascend(config, profile) == [], (kernel.symbol, config)
                assert config.grid <= profile.cores
                assert config.working_set <= profile.unified_buffer_bytes
                assert "num_warps" not in config.options
