"""The compiler driver against the real system C compiler: build, load, compute, cache, fail cleanly."""

from __future__ import annotations

import ctypes
import math
from pathlib import Path

import numpy as np
import pytest

from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.compiler import (
    Artifact,
    KernelSource,
    compile_kernels,
    compiler_identity,
    kernel_digest,
    kernel_flags,
    simd_math_preamble,
)
from graph_autofusion.backend.cpu.isa import host_isa, target_isa
from graph_autofusion.errors import CompilationError, IsaMismatchError

AXPB_RELU = """
#include <stdint.h>
/* y = relu(x * w + b), one fused pass */
void axpb_relu(const float *restrict x, const float *restrict w, const float *restrict b,
               float *restrict y, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        float v = x[i] * w[i] + b[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}
"""

ROW_SUM = """
#include <stdint.h>
void row_sum(const float *restrict x, float *restrict out, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        float acc = 0.0f;
#pragma omp simd reduction(+:acc)
        for (int64_t c = 0; c < cols; ++c) acc += x[r * cols + c];
        out[r] = acc;
    }
}
"""


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


@pytest.fixture
def cache(tmp_path: Path) -> KernelCache:
    return KernelCache(tmp_path / "kernels")


def _files(cache: KernelCache) -> list[str]:
    return sorted(p.name for p in cache.root.iterdir() if p.is_file())


def test_kernel_compiles_loads_and_computes(cache: KernelCache) -> None:
    (art,) = compile_kernels([KernelSource("axpb_relu", AXPB_RELU)], cache=cache)
    assert art.path.is_file() and art.path.parent == cache.root and not art.cached
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(10_001).astype(np.float32) for _ in range(3))
    y = np.empty_like(x)
    art.load().axpb_relu(_ptr(x), _ptr(w), _ptr(b), _ptr(y), ctypes.c_int64(x.size))
    # No FMA contraction: the product and the sum round separately, exactly as numpy does, so the
    # result is bit-identical (a contracted build differs in the last bit on many elements).
    np.testing.assert_array_equal(y, np.maximum(x * w + b, np.float32(0)))


def test_simd_reduction_pragma_is_honoured_and_accurate(cache: KernelCache) -> None:
    (art,) = compile_kernels([KernelSource("row_sum", ROW_SUM, uses_openmp=False)], cache=cache)
    x = np.random.default_rng(1).standard_normal((7, 1000)).astype(np.float32)
    out = np.empty(7, np.float32)
    art.load().row_sum(_ptr(x), _ptr(out), ctypes.c_int64(7), ctypes.c_int64(1000))
    np.testing.assert_allclose(out, x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)
    assert "-fopenmp-simd" in kernel_flags(KernelSource("row_sum", ROW_SUM, uses_openmp=False))


def test_repeated_kernel_compiles_once(cache: KernelCache) -> None:
    first = compile_kernels(
        [KernelSource("k_a", AXPB_RELU), KernelSource("k_b", AXPB_RELU), KernelSource("k_c", ROW_SUM)],
        cache=cache,
    )
    assert [a.name for a in first] == ["k_a", "k_b", "k_c"]
    assert first[0].digest == first[1].digest != first[2].digest
    assert first[0].path == first[1].path
    assert cache.stats.misses == 2 and cache.stats.hits == 0
    assert len(cache.digests()) == 2

    again = compile_kernels([KernelSource("other_name", AXPB_RELU)], cache=cache)
    assert again[0].cached and again[0].digest == first[0].digest
    stats = cache.stats
    assert (stats.hits, stats.misses) == (1, 2)
    assert stats.bytes == sum(p.stat().st_size for p in cache.root.iterdir() if p.is_file())


def test_progress_counts_unique_kernels(cache: KernelCache) -> None:
    calls: list[tuple[int, int]] = []
    sources = [KernelSource(f"k{i}", AXPB_RELU.replace("axpb_relu", f"f{i % 3}")) for i in range(5)]
    compile_kernels(sources, cache=cache, jobs=2, progress=lambda d, t: calls.append((d, t)))
    assert calls[0] == (0, 3) and calls[-1] == (3, 3)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_syntax_error_names_kernel_and_leaves_nothing(cache: KernelCache) -> None:
    bad = KernelSource("broken_kernel", "void broken_kernel(float *x) { x[0] = ; }\n")
    with pytest.raises(CompilationError) as info:
        compile_kernels([bad], cache=cache)
    err = info.value
    assert err.code == "compilation_failed"
    assert "broken_kernel" in err.message and "expected expression" in err.message
    assert err.details["kernel"] == "broken_kernel"
    assert "broken_kernel.c:1:" in err.details["stderr"]
    assert _files(cache) == []  # no artifact, no source, no temporary file


def test_undefined_symbol_fails_at_build_time(cache: KernelCache) -> None:
    # Without -Wl,--no-undefined this would build and only fail at dlopen in another process.
    src = "float nope(float x);\nfloat calls_missing(float x) { return nope(x); }\n"
    with pytest.raises(CompilationError, match="calls_missing") as info:
        compile_kernels([KernelSource("calls_missing", src)], cache=cache)
    assert "undefined reference to `nope'" in info.value.message
    assert _files(cache) == []


def test_one_failure_in_a_batch_raises_and_keeps_good_artifacts_whole(cache: KernelCache) -> None:
    sources = [KernelSource("good", AXPB_RELU), KernelSource("bad", "int bad( {")]
    with pytest.raises(CompilationError) as info:
        compile_kernels(sources, cache=cache, jobs=2)
    assert info.value.details["kernel"] == "bad"
    assert not any(name.startswith(".tmp-") for name in _files(cache))
    for digest in cache.digests():  # whatever finished is a loadable object
        ctypes.CDLL(str(cache.path_for(digest)))


def test_digest_covers_isa_and_source_but_not_name() -> None:
    src = KernelSource("a", AXPB_RELU)
    assert kernel_digest(src) == kernel_digest(KernelSource("b", AXPB_RELU))
    assert kernel_digest(src) != kernel_digest(KernelSource("a", AXPB_RELU + "\n"))
    if target_isa().arch == "x86_64":
        names = ["v2", "v3", "v4", "v4+avx512vnni", "v4+avx512bf16+avx512vnni"]
        digests = {kernel_digest(src, isa=target_isa(name)) for name in names}
        assert len(digests) == len(names)
    assert kernel_digest(src) != kernel_digest(KernelSource("a", AXPB_RELU, uses_openmp=False))


def test_flags_avoid_fast_math_and_name_an_isa_level() -> None:
    flags = kernel_flags(KernelSource("a", AXPB_RELU))
    assert "-ffp-contract=off" in flags and "-O3" in flags and "-fopenmp" in flags
    assert not any("fast-math" in f or f in {"-march=native", "-mcpu=native"} for f in flags)
    if target_isa().arch == "x86_64":
        assert any(f.startswith("-march=x86-64") for f in flags)


def test_missing_compiler_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, cache: KernelCache) -> None:
    monkeypatch.setenv("AUTOFUSION_CC", "no-such-cc-9f3a")
    with pytest.raises(CompilationError) as info:
        compile_kernels([KernelSource("a", AXPB_RELU)], cache=cache)
    assert info.value.code == "compiler_not_found" and "AUTOFUSION_CC" in info.value.message


def test_compiler_identity_is_probed() -> None:
    info = compiler_identity()
    assert Path(info.path).exists()
    assert info.version and info.version != "unknown"
    assert info.target


def test_kernel_name_must_be_an_identifier() -> None:
    with pytest.raises(ValueError, match="C identifier"):
        KernelSource("../etc/passwd", "int x;")


def _scale_kernel(i: int, helper: str = "") -> KernelSource:
    body = f"""{helper}
void scale{i}(float *x, long n) {{
#pragma omp parallel for if(n > 65536)
    for (long j = 0; j < n; ++j) x[j] = x[j] * {i + 2}.0f;
}}
"""
    return KernelSource(f"scale{i}", body, prelude="#include <stdint.h>\n")


def _run_scale(art: Artifact, i: int) -> None:
    x = np.arange(5, dtype=np.float32)
    getattr(art.load(), f"scale{i}")(_ptr(x), ctypes.c_long(5))
    np.testing.assert_array_equal(x, np.arange(5, dtype=np.float32) * (i + 2))


def test_combined_units_share_objects_and_alias_every_kernel(cache: KernelCache) -> None:
    sources = [_scale_kernel(i) for i in range(6)]
    arts = compile_kernels(sources, cache=cache, jobs=2, combine=True)
    assert len({a.path for a in arts}) == 2  # two units for two jobs
    assert len(cache.digests()) == 2
    assert set(cache.digests(aliases=True)) >= {a.digest for a in arts}
    for i, art in enumerate(arts):
        _run_scale(art, i)
    # Each kernel is now a hit on its own, whichever batch it comes in.
    (alone,) = compile_kernels([sources[4]], cache=cache)
    assert alone.cached and alone.path == arts[4].path
    assert cache.stats.misses == 6


def test_combined_unit_with_clashing_names_falls_back_to_one_object_each(cache: KernelCache) -> None:
    helper = "static float twice(float v) { return 2.0f * v; }"
    sources = [_scale_kernel(i, helper) for i in range(2)]
    arts = compile_kernels(sources, cache=cache, jobs=1, combine=True)
    assert arts[0].path != arts[1].path
    for i, art in enumerate(arts):
        _run_scale(art, i)


def test_broken_kernel_in_a_combined_batch_is_named(cache: KernelCache) -> None:
    sources = [_scale_kernel(i) for i in range(7)]
    sources.insert(5, KernelSource("the_broken_one", "void b(void) { undeclared_fn(); }"))
    with pytest.raises(CompilationError) as info:
        compile_kernels(sources, cache=cache, jobs=1, combine=True)
    assert info.value.details["kernel"] == "the_broken_one"  # found by splitting the unit
    assert "undeclared_fn" in info.value.details["stderr"]
    assert not any(name.startswith(".tmp-") for name in _files(cache))
    # The halves without the broken kernel were built as units and are reused now.
    arts = compile_kernels([s for s in sources if s.name != "the_broken_one"], cache=cache, combine=True)
    assert sum(a.cached for a in arts) >= 3
    for i, art in enumerate(arts):
        _run_scale(art, i)


def test_simd_math_preamble_vectorizes_transcendentals_accurately(cache: KernelCache) -> None:
    src = """
void trans(float *restrict e, float *restrict t, float *restrict g, const float *restrict x, long n) {
#pragma omp simd
    for (long i = 0; i < n; ++i) {
        e[i] = expf(x[i]);
        t[i] = tanhf(x[i]);
        g[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678f));
    }
}
"""
    preamble = simd_math_preamble()
    (art,) = compile_kernels(
        [KernelSource("trans", src, prelude=preamble or "#include <math.h>\n")], cache=cache
    )
    x = np.random.default_rng(3).uniform(-12, 12, 4099).astype(np.float32)
    e, t, g = (np.empty_like(x) for _ in range(3))
    art.load().trans(_ptr(e), _ptr(t), _ptr(g), _ptr(x), ctypes.c_long(x.size))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(e, np.exp(x64), rtol=1e-6)
    np.testing.assert_allclose(t, np.tanh(x64), rtol=1e-6, atol=1e-7)
    gelu = 0.5 * x64 * (1 + np.vectorize(math.erf)(x64 / math.sqrt(2)))
    np.testing.assert_allclose(g, gelu, rtol=1e-5, atol=1e-6)
    if target_isa().level == 3 and preamble:
        assert b"_ZGVdN8v_expf" in art.path.read_bytes()  # the AVX2 vector variant is called
    if target_isa().level == 4 and preamble:
        assert b"_ZGVeN16v_expf" in art.path.read_bytes()  # the AVX-512 one


@pytest.mark.skipif(target_isa().arch != "x86_64", reason="x86-64 levels")
def test_an_avx512_build_is_cached_apart_and_calls_512_bit_math(
    monkeypatch: pytest.MonkeyPatch, cache: KernelCache
) -> None:
    """Built here for x86-64-v4 whatever this host is; the objects are read, never loaded."""
    src = """
void vexp(float *restrict y, const float *restrict x, long n) {
#pragma omp simd
    for (long i = 0; i < n; ++i) y[i] = expf(x[i]) * x[i];
}
"""
    monkeypatch.setenv("AUTOFUSION_ISA", "v4+avx512vnni")
    v4_preamble = simd_math_preamble()
    (v4,) = compile_kernels(
        [KernelSource("vexp", src, prelude=v4_preamble or "#include <math.h>\n")], cache=cache
    )
    monkeypatch.setenv("AUTOFUSION_ISA", "v3")
    v3_preamble = simd_math_preamble()
    (v3,) = compile_kernels(
        [KernelSource("vexp", src, prelude=v3_preamble or "#include <math.h>\n")], cache=cache
    )
    assert v4.digest != v3.digest and v4.path != v3.path and not v4.cached
    if not v4.isa.runs_on(host_isa()):  # loading it to call it is refused, not a SIGILL later
        with pytest.raises(IsaMismatchError):
            v4.load()
    assert sorted(cache.digests()) == sorted([v3.digest, v4.digest])
    if v4_preamble:  # glibc's libmvec: 16 lanes in zmm registers
        assert "simdlen(16)" in v4_preamble and b"_ZGVeN16v_expf" in v4.path.read_bytes()
        assert b"_ZGVeN16v_expf" not in v3.path.read_bytes()


def test_compiler_timeout_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, cache: KernelCache) -> None:
    monkeypatch.setenv("AUTOFUSION_CC_TIMEOUT", "0.001")
    with pytest.raises(CompilationError) as info:
        compile_kernels([KernelSource("slow_one", AXPB_RELU + "\n/* t */\n")], cache=cache)
    assert info.value.code == "compilation_timeout" and info.value.details["kernel"] == "slow_one"
    assert _files(cache) == []
