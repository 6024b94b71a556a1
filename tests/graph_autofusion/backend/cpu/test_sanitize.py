"""The sanitizer debug build: flags in the cache key, and reads of unwritten memory failing loudly.

ASan kernels only load into a process started with the ASan runtime, so those checks run a child
Python under `sanitize.subprocess_env()` (LD_PRELOAD of the compiler's libasan). Each negative
check builds a real kernel that does the wrong thing and asserts the child dies with the report.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from graph_autofusion.backend.cpu import sanitize
from graph_autofusion.backend.cpu.compiler import KernelSource, kernel_digest, kernel_flags

ROOT = Path(__file__).resolve().parents[4]
pytestmark = pytest.mark.timeout(300)


def _child(code: str, mode: str, cache: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = sanitize.subprocess_env(mode=mode)
    env["AUTOFUSION_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = f"{ROOT}:{ROOT / 'clients' / 'python'}"
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        ("", ""),
        ("0", ""),
        ("1", sanitize.ADDRESS),
        ("address", sanitize.ADDRESS),
        ("undefined", sanitize.UNDEFINED),
    ],
)
def test_mode_from_the_environment_value(value: str, mode: str) -> None:
    assert sanitize.sanitize_mode(value) == mode


def test_sanitized_kernels_have_their_own_cache_key(monkeypatch: pytest.MonkeyPatch) -> None:
    src = KernelSource("k", "void k(void *const *a) { (void)a; }\n")
    plain = kernel_digest(src)
    monkeypatch.setenv(sanitize.ENV, "1")
    assert "-fsanitize=address,undefined" in kernel_flags(src)
    assert kernel_digest(src) != plain
    monkeypatch.setenv(sanitize.ENV, "undefined")
    assert kernel_digest(src) not in (plain,)


def test_address_mode_without_the_runtime_is_refused_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    if sanitize.asan_loaded():
        pytest.skip("this process runs with the ASan runtime")
    from graph_autofusion.backend.cpu.runtime import compile_model

    monkeypatch.setenv(sanitize.ENV, "1")
    with pytest.raises(sanitize.SanitizerError) as err:
        compile_model(None)  # type: ignore[arg-type]  # refused before the model is read
    assert err.value.code == "sanitizer_runtime_missing"
    assert "LD_PRELOAD" in err.value.message


def test_a_slice_of_the_node_suite_is_clean_and_deterministic_under_asan(tmp_path: Path) -> None:
    """Every case of these ops, twice, differently poisoned, under ASan + UBSan + live-range
    poisoning of the arena: no report, no wrong answer, identical outputs."""
    proc = _child(
        """
        from graph_autofusion.backend.cpu.cache import default_cache
        from graph_autofusion.backend.cpu.suite import WRONG, ERROR, format_suite, run_suite, suite_cases
        names = ["Softmax", "LogSoftmax", "LayerNormalization", "Mod", "Gather", "MatMul", "Conv",
                 "test_attention_4d_causal_nonpad_batch_prefill_expanded",
                 "test_attention_4d_gqa_causal_nonpad_decode_expanded",
                 "test_sce_NCd1d2d3_none_no_weight_negative_ii_expanded"]
        outcomes = run_suite(suite_cases(names), default_cache(), repeat=2, jobs=2)
        print(format_suite(outcomes, per_op=False))
        bad = [o for o in outcomes if o.status in (WRONG, ERROR)]
        raise SystemExit(1 if bad or len(outcomes) < 50 else 0)
        """,
        sanitize.ADDRESS,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "AddressSanitizer" not in proc.stderr and "runtime error" not in proc.stderr


def test_a_read_past_a_live_buffer_in_the_arena_is_reported(tmp_path: Path) -> None:
    """Redzones and live ranges: reading one float past `s` while only live buffers are addressable
    aborts the child with an ASan report (an arena neighbour would otherwise answer silently)."""
    proc = _child(
        """
        import ctypes, numpy as np, onnx
        from onnx import helper
        from graph_autofusion.backend.cpu.compiler import KernelSource, compile_kernels
        from graph_autofusion.backend.cpu.runtime import compile_model
        f = onnx.TensorProto.FLOAT
        g = helper.make_graph(
            [helper.make_node("Exp", ["x"], ["s"]), helper.make_node("Neg", ["s"], ["y"])], "g",
            [helper.make_tensor_value_info("x", f, [4])], [helper.make_tensor_value_info("y", f, [4])],
            value_info=[helper.make_tensor_value_info("s", f, [4])])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
        compiled = compile_model(model, threads=1)
        print(compiled({"x": np.zeros(4, np.float32)})["y"])  # a clean run first
        reader = KernelSource("af_read", "float af_read(const float *p, long i) { return p[i]; }\\n",
                              uses_openmp=False)
        fn = compile_kernels([reader])[0].load()["af_read"]
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_void_p, ctypes.c_long]
        base = compiled.array("s").ctypes.data
        compiled._guard(1)  # the Neg step: s is live
        print("in bounds", fn(base, 3), flush=True)
        print("past the end", fn(base, 4), flush=True)
        """,
        sanitize.ADDRESS,
        tmp_path,
    )
    assert "in bounds" in proc.stdout, proc.stderr[-3000:]
    assert "past the end" not in proc.stdout
    assert proc.returncode != 0
    assert "AddressSanitizer: use-after-poison" in proc.stderr


def test_undefined_behaviour_aborts_in_process_under_ubsan(tmp_path: Path) -> None:
    """UBSan alone needs no preloading: a shift by 40 of an int aborts the child with a report."""
    proc = _child(
        """
        from graph_autofusion.backend.cpu.compiler import KernelSource, compile_kernels
        src = KernelSource("af_shift", "int af_shift(int a, int b) { return a << b; }\\n", uses_openmp=False)
        fn = compile_kernels([src])[0].load()["af_shift"]
        print("ok", fn(1, 3), flush=True)
        print("bad", fn(1, 40), flush=True)
        """,
        sanitize.UNDEFINED,
        tmp_path,
    )
    assert "ok 8" in proc.stdout, proc.stderr[-3000:]
    assert "bad" not in proc.stdout
    assert proc.returncode != 0
    assert "runtime error: shift exponent 40" in proc.stderr


def test_kernels_given_null_for_weights_they_read_packed_are_clean_under_asan(tmp_path: Path) -> None:
    """The raw weights a kernel reads only packed are released and passed as NULL: under ASan +
    UBSan, twice, differently poisoned, the model still matches onnxruntime and nothing reports."""
    proc = _child(
        """
        import sys
        sys.path.insert(0, "tests/graph_autofusion/backend/cpu")
        from cpu_backend_helpers import assert_close, ort_run, packed_weights_model, random_feeds
        from graph_autofusion.backend.cpu.runtime import compile_model
        model = packed_weights_model()
        compiled = compile_model(model, threads=2)
        assert compiled.sanitize and compiled.stats["released_weights_bytes"] > 0, compiled.stats
        feeds = random_feeds(model)
        for _ in range(2):
            assert_close(compiled(feeds), ort_run(model, feeds))
        print("clean", compiled.stats["released_weights_bytes"])
        """,
        sanitize.ADDRESS,
        tmp_path,
    )
    assert proc.returncode == 0 and "clean" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "AddressSanitizer" not in proc.stderr and "runtime error" not in proc.stderr
