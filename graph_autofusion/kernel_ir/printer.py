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
            lines.append(f"{pad}for {s.var} < {s.extent}{marks}:")
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


def format_kernel(kernel: Kernel) -> str:
    params = ", ".join(str(b) for b in kernel.params)
    head = [f"kernel {kernel.name}({params})"]
    if kernel.description:
        head.append(f"  # {kernel.description}")
    head += [f"  const {b}" for b, _ in kernel.constants]
    return "\n".join(head + format_stmts(kernel.body)) + "\n"
