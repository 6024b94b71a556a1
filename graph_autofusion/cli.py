"""`autofusion`: the command line.

    autofusion fuse MODEL -o OUT.onnx [--cost-model …] [--input-shape name=1,128 …] [--report r.json]
    autofusion hardware [--json]              this host: CPU, ISA, what kernels are built for
    autofusion load BUNDLE [--no-recompile]   check that a bundle loads (and runs: --run) here
    autofusion serve | worker                 the service (needs the service extras, installed by default)
    autofusion submit | status | report       the remote client (needs graph-autofusion-client)

Exit codes of `fuse`: 0 fused, 2 bad input (model, config or usage), 3 verification failed.
`load` exits 2 on a bundle it cannot load (with `--no-recompile`, `isa_mismatch` on a host that
lacks the bundle's instruction set).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .config import FusionConfig
from .errors import FusionError, InvalidConfigError, VerificationError


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def summary_table(report: dict) -> str:
    """The short before → after table printed by `fuse` (and reused by the remote CLI)."""
    est = report["estimates"]
    rows = [
        ("operators", f"{report['operators']['original']} (canonical {report['operators']['canonical']})"),
        ("kernels", f"{report['kernels']['before']} → {report['kernels']['after']}"),
        ("fusions", str(report["fusions"])),
        (
            "bytes moved",
            f"{_human_bytes(est['bytes_moved']['before'])} → {_human_bytes(est['bytes_moved']['after'])}",
        ),
        (
            "peak memory",
            f"{_human_bytes(est['peak_memory_bytes']['before'])} → "
            f"{_human_bytes(est['peak_memory_bytes']['after'])}",
        ),
        (
            f"latency ({est['profile']})",
            f"{est['latency_us']['before']:.1f} µs → {est['latency_us']['after']:.1f} µs",
        ),
        ("hardware", _hardware_cell(report.get("hardware") or {})),
        ("strategy", report["strategy"]),
        ("refused", ", ".join(f"{k}×{v}" for k, v in report["refused_by_code"].items()) or "none"),
        ("host ops", _host_ops_cell(report.get("host_ops") or [])),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"  {k:<{width}}  {v}" for k, v in rows]
    # Every fallback on its own line with its reason: slow paths are never silent.
    lines += [
        f"  {'':<{width}}    {h['op_type']} {h['node']!r} [{h['code']}] {h['reason']}"
        for h in report.get("host_ops") or []
    ]
    return "\n".join(lines)


def _hardware_cell(hw: dict) -> str:
    parts = [f"ISA {hw['isa']}"] if hw.get("isa") else []
    if hw.get("kernel_isa") and hw.get("kernel_isa") != hw.get("isa"):
        parts.append(f"kernels built for {hw['kernel_isa']}")
    return f"{hw.get('name', '?')}" + (f" ({', '.join(parts)})" if parts else "")


def _host_ops_cell(hosts: list[dict]) -> str:
    if not hosts:
        return "none (every op runs as a compiled kernel)"
    by_code: dict[str, int] = {}
    for h in hosts:
        by_code[h["code"]] = by_code.get(h["code"], 0) + 1
    return f"{len(hosts)} run by onnx.reference: " + ", ".join(f"{k}×{v}" for k, v in sorted(by_code.items()))


def _parse_shape(text: str) -> tuple[str, list[int]]:
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=D0,D1,…, got {text!r}")
    try:
        return name, [int(d) for d in dims.split(",") if d]
    except ValueError:
        raise argparse.ArgumentTypeError(f"dimensions must be integers in {text!r}") from None


def _add_fuse(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("fuse", help="fuse an ONNX model locally", description="Fuse an ONNX model.")
    p.add_argument("model", type=Path, help="ONNX model file")
    p.add_argument("-o", "--output", type=Path, help="where to write the fused model")
    p.add_argument("--cost-model", choices=["memory_bandwidth", "compute_density", "latency"])
    p.add_argument("--hardware", help="hardware profile for the cost model (cpu, ascend910)")
    p.add_argument(
        "--input-shape",
        type=_parse_shape,
        action="append",
        default=[],
        metavar="NAME=D0,D1",
        help="bind a symbolic input shape (repeatable)",
    )
    p.add_argument("--config", type=Path, help="FusionConfig as JSON (flags override it)")
    p.add_argument("--max-fusion-size", type=int)
    p.add_argument("--disable-pattern", action="append", default=[], metavar="NAME")
    p.add_argument("--report", type=Path, help="write the full report as JSON")
    p.add_argument(
        "--no-host-ops",
        action="store_true",
        help="refuse (exit 2, host_op_refused) a model with any op the backend cannot compile",
    )
    p.add_argument(
        "--max-activation-bytes",
        type=int,
        metavar="N",
        help="refuse (exit 2, model_too_large) a model whose activations peak above N bytes",
    )
    p.add_argument(
        "--verify",
        choices=["runtime", "onnxruntime", "none"],
        default="runtime",
        help="check the fused model against onnxruntime on random inputs: 'runtime' compiles and runs "
        "the generated kernels (default), 'onnxruntime' runs the fused ONNX in onnxruntime",
    )
    p.set_defaults(func=_fuse_command)


def _fuse_command(args: argparse.Namespace) -> int:
    from .api import fuse

    try:
        data = json.loads(args.config.read_text()) if args.config else {}
        config = FusionConfig.model_validate(data)
    except (OSError, ValueError) as err:
        raise InvalidConfigError(f"cannot read config {args.config}: {err}", code="invalid_config") from None
    flags = {
        "cost_model": args.cost_model,
        "hardware": args.hardware,
        "max_fusion_size": args.max_fusion_size,
        "input_shapes": {**config.input_shapes, **dict(args.input_shape)} if args.input_shape else None,
        "disabled_patterns": [*config.disabled_patterns, *args.disable_pattern] or None,
        "allow_host_ops": False if args.no_host_ops else None,
        "max_activation_bytes": args.max_activation_bytes,
    }
    for field, value in flags.items():
        if value is None:
            continue
        try:  # validate_assignment: a bad flag value is a config error (exit 2), not a traceback
            setattr(config, field, value)
        except ValueError as err:
            raise InvalidConfigError(f"invalid value for {field}: {err}", code="invalid_config") from None
    fused = fuse(args.model, config)
    result = fused.verify(runner=args.verify) if args.verify != "none" else None
    report = fused.report()  # after verify: compiling confirms the host ops
    if result is not None:
        report["verification"] = result.to_dict()
    if args.output:
        fused.save(args.output)
    if args.report:
        args.report.write_text(json.dumps(report, indent=2))
    print(f"{args.model} → {args.output or '(not written)'}")
    print(summary_table(report))
    if result is not None:
        print(verification_lines(report["verification"], args.verify))
        if not result.passed:
            return 3
    return 0


def verification_lines(verification: dict, runner: str) -> str:
    """`verification passed|FAILED`, then each output's error against its tolerance (worst first)."""
    state = "passed" if verification["passed"] else "FAILED"
    rule = (
        f"tolerance {verification.get('safety', 4):g}·noise·(|ref| + rms)"
        if verification.get("rule", "derived") == "derived"
        else f"rtol {verification['rtol']:g}, atol {verification['atol']:g}"
    )
    lines = [f"  verification  {state} vs onnxruntime ({runner}); {rule}"]
    outputs = sorted(verification["outputs"], key=lambda o: -o["worst_ratio"])
    for o in outputs[:5]:
        lines.append(
            f"    {o['name']}: max abs error {o['max_abs']:.3g}, {o['worst_ratio']:.3g}x its tolerance "
            f"({o.get('error_at_worst', 0):.3g} vs {o.get('tolerance_at_worst', 0):.3g} at the worst element"
            + (f"; {o['roundings']:.0f} roundings deep" if o.get("roundings") else "")
            + ")"
        )
    if len(outputs) > 5:
        lines.append(f"    … {len(outputs) - 5} more outputs, all within {outputs[5]['worst_ratio']:.3g}x")
    return "\n".join(lines)


def _add_hardware(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "hardware",
        help="describe this host: CPU, ISA, the ISA kernels are built for, the cost model's figures",
        description="Describe this host as the compiler and the cost model see it.",
    )
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=_hardware_command)


def _hardware_command(args: argparse.Namespace) -> int:
    from .backend.cpu.compiler import compiler_identity
    from .backend.cpu.isa import host_isa, target_isa
    from .hardware import cpu_model, cpu_profile

    profile = cpu_profile()
    cc = compiler_identity()
    info = {
        "cpu": cpu_model(),
        "cpus": profile.cores,
        "isa": host_isa().name,
        "kernel_isa": target_isa().name,
        "kernel_flags": " ".join(target_isa().march_flags()),
        "compiler": cc.version,
        "peak_gflops": round(profile.peak_flops / 1e9, 1),
        "bandwidth_gbs": round(profile.memory_bandwidth / 1e9, 1),
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    rows = [
        ("cpu", f"{info['cpu']} ({info['cpus']} CPUs)"),
        ("isa", info["isa"]),
        ("kernels built for", f"{info['kernel_isa']} ({info['kernel_flags'] or 'compiler default'})"),
        ("compiler", info["compiler"]),
        ("peak (sgemm)", f"{info['peak_gflops']} GFLOP/s"),
        ("bandwidth (copy)", f"{info['bandwidth_gbs']} GB/s"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"  {k:<{width}}  {v}" for k, v in rows))
    return 0


def _add_load(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "load",
        help="load a bundle here (recompiling it if this host lacks its ISA) and say how",
        description="Load a bundle as `graph_autofusion.load` does and describe the result.",
    )
    p.add_argument("bundle", type=Path, help="bundle directory or .tar.gz")
    p.add_argument(
        "--no-recompile",
        action="store_true",
        help="fail (exit 2, isa_mismatch) instead of recompiling a bundle built for an ISA this host lacks",
    )
    p.add_argument("--threads", type=int, help="kernel threads (default: the CPUs available)")
    p.add_argument("--run", action="store_true", help="also run it once on random inputs")
    p.set_defaults(func=_load_command)


def _load_command(args: argparse.Namespace) -> int:
    import time

    from .backend.cpu.bundle import load
    from .backend.cpu.isa import host_isa
    from .verify import random_inputs

    compiled = load(args.bundle, threads=args.threads, recompile=not args.no_recompile)
    recompiled = compiled.stats.get("recompiled")
    how = (
        f"recompiled from {recompiled['from']} for {recompiled['to']} in {recompiled['seconds']:.1f} s"
        if recompiled
        else f"loaded as built ({compiled.isa.name})"
    )
    print(f"{args.bundle}: {how}; host ISA {host_isa().name}")
    print(f"  {compiled.stats['kernels']} kernels, {len(compiled.stats['host_ops'])} host ops")
    if args.run:
        feeds = random_inputs(compiled.model)
        t0 = time.perf_counter()
        outputs = compiled(feeds)
        ms = (time.perf_counter() - t0) * 1e3
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in outputs.items())
        print(f"  ran once in {ms:.1f} ms: {shapes}")
    return 0


_OPTIONAL = {
    "autofusion_service.cli": "the service (serve)",
    "autofusion_worker.cli": "the worker (worker)",
    "graph_autofusion_client.cli": "the remote client (submit, status, report); pip install clients/python",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autofusion", description="Operator-fusion compiler for ONNX models."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_fuse(sub)
    _add_hardware(sub)
    _add_load(sub)
    for module in _OPTIONAL:
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name and module.startswith(err.name):
                continue  # that part is not installed: its commands are simply absent
            raise
        found.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except VerificationError as err:
        print(f"autofusion: {err.message}", file=sys.stderr)
        return 3
    except FusionError as err:
        print(f"autofusion: error [{err.code}]: {err.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
