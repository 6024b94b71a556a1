"""The IR's text form: what `autofusion` prints for a kernel, and what a failing test shows."""

from __future__ import annotations

from .nodes import Assign, Call, Declare, If, Kernel, Let, Loop, Stmt, Store


def format_stmts(body: tuple[Stmt, ...], indent: int = 1) -> list[str]:
    pad = "  " * indent
    lines: list[str] = []
    for s in body:
        if isinstance(s, Let):
            lines.append(f"{pad}{s.var} = {s.value}")
        elif isinstance(s, Declare):
            lines.append(f"{pad}var {s.var}: {s.var.dtype.value} = {s.init}")
        elif isinstance(s, Assign):
            lines.append(f"{pad}{s.var} <- {s.value}")
        elif isinstance(s, Store):
            lines.append(f"{pad}{s.buffer.name}[{s.index}] <- {s.value}")
        elif isinstance(s, Loop):
            marks = "".join(f" {m}" for m, on in (("parallel", s.parallel), ("vector", s.vector)) if on)
            marks += "".join(f" {op}({v})" for op, v in s.reductions)
            marks += "".join(f" scratch {b}" for b in s.scratch)
            span = f"{s.var} < {s.stop}" if _is_zero(s.start) else f"{s.start} <= {s.var} < {s.stop}"
            span += f" step {s.step}" if s.step != 1 else ""
            lines.append(f"{pad}for {span}{marks}:")
            lines.extend(format_stmts(s.body, indent + 1))
        elif isinstance(s, If):
            lines.append(f"{pad}if {s.cond}:")
            lines.extend(format_stmts(s.then, indent + 1))
            if s.otherwise:
                lines.append(f"{pad}else:")
                lines.extend(format_stmts(s.otherwise, indent + 1))
        elif isinstance(s, Call):
            lines.append(f"{pad}call {s.function}({', '.join(map(str, s.args))})")
    return lines


def _is_zero(value: object) -> bool:
    return value == 0 if isinstance(value, int) else str(value) == "0"


def format_kernel(kernel: Kernel) -> str:
    params = ", ".join(str(b) for b in kernel.params)
    head = [f"kernel {kernel.name}({params})"]
    if kernel.description:
        head.append(f"  # {kernel.description}")
    head += [f"  const {b}" for b, _ in kernel.constants]
    return "\n".join(head + format_stmts(kernel.body)) + "\n"
