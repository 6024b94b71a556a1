"""Every zoo kernel the Triton renderer makes for `cuda` is accepted by Triton's real compiler:
compiled ahead of time for sm80 down to a cubin (ptxas ships with triton), on this GPU-less host.
The interpreter tests check what the kernels compute; this checks that they compile.

It runs in a subprocess: this test session's triton is bound to the interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import json, sys
import graph_autofusion as gaf
from graph_autofusion.backend.triton.ahead import compile_model_ahead
out = {}
for name, kw in gaf.zoo.TINY.items():
    result = compile_model_ahead(gaf.fuse(gaf.zoo.build(name, **kw)).model, cache_dir=sys.argv[1])
    out[name] = {
        "kernels": {s: [[r["kind"], len(r["binary"]), r["metadata"].get("num_warps")] for r in recs]
                    for s, recs in result["kernels"].items()},
        "host_ops": result["host_ops"],
    }
print(json.dumps(out))
"""


def test_every_zoo_kernel_compiles_to_a_cubin(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    root = Path(__file__).resolve().parents[4]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "kernels")],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, found in result.items():
        assert found["kernels"], name
        for symbol, launches in found["kernels"].items():
            assert launches, (name, symbol)
            for kind, size, warps in launches:
                assert kind == "cubin" and size > 0 and warps == 4, (name, symbol)
        assert found["host_ops"] == {}, (name, found["host_ops"])
