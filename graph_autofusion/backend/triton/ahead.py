"""Ahead-of-time compilation of rendered kernels for a CUDA target, with no GPU present.

Triton compiles a jit function for a named target (`GPUTarget("cuda", 80, 32)`) through its
whole pipeline — TTIR, TTGIR, LLVM IR, PTX and, with the `ptxas` the triton wheel ships, a cubin
— without touching a device. That gives a CUDA worker's artifacts their binaries and launch
metadata before any run, and lets CI check that every generated kernel is accepted by the real
compiler, not only by the interpreter (which is more lenient about types and shapes).
"""

from __future__ import annotations

from typing import Any

from ...hardware import HardwareProfile
from ...kernel_ir import DType
from .render import RenderedKernel

POINTER_TYPES = {
    DType.F64: "*fp64", DType.F32: "*fp32", DType.F16: "*fp16", DType.BF16: "*bf16",
    DType.I64: "*i64", DType.I32: "*i32", DType.I16: "*i16", DType.I8: "*i8",
    DType.U64: "*u64", DType.U32: "*u32", DType.U16: "*u16", DType.U8: "*u8", DType.BOOL: "*i1",
}  # fmt: skip


def signature(rendered: RenderedKernel) -> dict[str, str]:
    """Each pointer argument's Triton type, by argument name, in call order."""
    buffers = [*rendered.params, *(b for b, _ in rendered.constants), *(b for b, _ in rendered.scratch)]
    names = rendered.launches[0].args if rendered.launches else ()
    return {name: POINTER_TYPES[b.dtype] for name, b in zip(names, buffers, strict=True)}


def compile_ahead(
    rendered: RenderedKernel, module: Any, configs: list[Any], profile: HardwareProfile
) -> list[dict[str, Any]]:
    """Compile every launch of `rendered` for `profile`'s compute capability: one record per
    launch with the cubin (bytes) and the metadata Triton keeps (shared memory, warps, ...)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if profile.compute_capability is None:
        raise ValueError(f"{profile.name} is not a CUDA profile")
    major, minor = profile.compute_capability
    target = GPUTarget("cuda", major * 10 + minor, 32)
    pointers = signature(rendered)
    records = []
    for launch, config in zip(rendered.launches, configs, strict=True):
        fn = getattr(module, launch.function)
        fn = getattr(fn, "fn", fn) if not hasattr(fn, "arg_names") else fn
        sig: dict[str, str] = {}
        constants: dict[str, int] = {}
        for name in fn.arg_names:
            if name in pointers:
                sig[name] = pointers[name]
            elif name in config.meta or name in ("BLOCK", "RBLOCK", "BM", "BN", "BK"):
                sig[name] = "constexpr"
                constants[name] = config.meta.get(name, 1)
            else:
                sig[name] = "i64"
        compiled = triton.compile(ASTSource(fn, sig, constants), target=target, options=dict(config.options))
        metadata = compiled.metadata._asdict() if hasattr(compiled.metadata, "_asdict") else {}
        records.append(
            {
                "function": launch.function,
                "kind": "cubin",
                "binary": compiled.asm["cubin"],
                "metadata": {
                    k: v for k, v in metadata.items() if isinstance(v, int | str | float | bool) or v is None
                },
            }
        )
    return records


def compile_model_ahead(
    model: Any, *, capability: tuple[int, int] | None = None, cache_dir: Any = None
) -> dict[str, Any]:
    """Render every kernel of a fused model for `cuda` and compile it for `capability` (sm80 by
    default) on a host without a GPU: `{"kernels": {symbol: [launch records]}, "host_ops": {symbol:
    reason}}`. Needs a process that does not interpret (TRITON_INTERPRET unset)."""
    from ...hardware import cuda_profile
    from ..cpu.extract import extract
    from .runtime import build_kernels, cache_root

    profile = cuda_profile(capability)
    built, declined = build_kernels(extract(model), profile, cache_root(cache_dir))
    kernels = {s: compile_ahead(k.rendered, k.module, k.configs, profile) for s, k in built.items()}
    return {"profile": profile.name, "kernels": kernels, "host_ops": declined}
