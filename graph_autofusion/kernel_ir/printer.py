"""The IR's text form: what a failing test shows, and what a person reads to see a kernel.

Expressions are DAGs: a value used twice in a statement is printed once, as `%n = ...` on the
line before the statement, so the text stays linear in the kernel's size.
"""

from __future__ import annotations

from collections import Counter

from .dtypes import DType
from .nodes import (
    Assign,
    Binary,
    Call,
    Cast,
    Declare,
    Expr,
    Fold,
    If,
    Kernel,
    Let,
    Load,
    Loop,
    Select,
    Stmt,
    Store,
    TensorAt,
    Unary,
)  # fmt: skip


def children(e: Expr) -> tuple[Expr, ...]:
    """The operands of an expression, in printing order."""
    if isinstance(e, Load):
        return (e.index,)
    if isinstance(e, TensorAt):
        return e.index
    if isinstance(e, Unary | Cast):
        return (e.x,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    if isinstance(e, Fold):
        return (e.start, e.stop, e.value)
    return ()


class _Names:
    """Names for the values a statement uses more than once."""

    def __init__(self, counter: list[int]) -> None:
        self.counter = counter
        self.names: dict[Expr, str] = {}
        self.lines: list[str] = []

    def prepare(self, exprs: list[Expr]) -> None:
        uses: Counter[Expr] = Counter()
        seen: set[Expr] = set()
        stack = list(exprs)
        while stack:
            e = stack.pop()
            for c in children(e):
                uses[c] += 1
                if c not in seen:
                    seen.add(c)
                    stack.append(c)
        self.shared = {e for e, n in uses.items() if n > 1 and children(e) and not _index_math(e)}

    def text(self, e: Expr) -> str:
        if e in self.names:
            return self.names[e]
        args = [self.text(c) for c in children(e)]
        if isinstance(e, Load):
            out = f"{e.buffer.name}[{args[0]}]"
        elif isinstance(e, TensorAt):
            out = f"{e.tensor}@[{', '.join(args)}]"
        elif isinstance(e, Unary):
            out = f"{e.op}({args[0]})"
        elif isinstance(e, Cast):
            out = f"{e.dtype.value}({args[0]})"
        elif isinstance(e, Binary):
            out = f"{e.op}({args[0]}, {args[1]})"
        elif isinstance(e, Select):
            out = f"select({', '.join(args)}{', guarded' if e.guarded else ''})"
        elif isinstance(e, Fold):
            by = "" if e.step == 1 else f" step {e.step}"
            out = f"{e.op}({e.var} from {args[0]} to {args[1]}{by}: {args[2]})"
        else:
            out = str(e)
        if e in self.shared:
            self.counter[0] += 1
            name = f"%{self.counter[0]}"
            self.lines.append(f"{name} = {out}")
            self.names[e] = name
            return name
        return out


def _index_math(e: Expr) -> bool:
    """Integer arithmetic on variables and constants: short, and clearer spelled out."""
    if isinstance(e, Binary):
        return e.dtype is DType.I64 and _index_math(e.a) and _index_math(e.b)
    return not children(e) and not isinstance(e, TensorAt)


def format_stmts(body: tuple[Stmt, ...], indent: int = 1, counter: list[int] | None = None) -> list[str]:
    pad = "  " * indent
    counter = counter if counter is not None else [0]
    lines: list[str] = []
    for s in body:
        names = _Names(counter)
        exprs = [
            getattr(s, f) for f in ("value", "init", "index", "cond") if isinstance(getattr(s, f, None), Expr)
        ]
        names.prepare(exprs)
        text = {id(e): names.text(e) for e in exprs}
        lines.extend(f"{pad}{line}" for line in names.lines)
        if isinstance(s, Let):
            lines.append(f"{pad}{s.var} = {text[id(s.value)]}")
        elif isinstance(s, Declare):
            lines.append(f"{pad}var {s.var}: {s.var.dtype.value} = {text[id(s.init)]}")
        elif isinstance(s, Assign):
            lines.append(f"{pad}{s.var} <- {text[id(s.value)]}")
        elif isinstance(s, Store):
            index = text.get(id(s.index), str(s.index))
            lines.append(f"{pad}{s.buffer.name}[{index}] <- {text[id(s.value)]}")
        elif isinstance(s, Loop):
            flags = (("parallel", s.parallel), ("dynamic", s.dynamic), ("vector", s.vector))
            marks = "".join(f" {m}" for m, on in flags if on)
            marks += "".join(f" {op}({v})" for op, v in s.reductions)
            marks += "".join(f" scratch {b}" for b in s.scratch)
            marks += f" macs({s.macs})" if s.parallel and s.macs else ""
            span = f"{s.var} < {s.stop}" if _is_zero(s.start) else f"{s.start} <= {s.var} < {s.stop}"
            span += f" step {s.step}" if s.step != 1 else ""
            lines.append(f"{pad}for {span}{marks}:")
            lines.extend(format_stmts(s.body, indent + 1, counter))
        elif isinstance(s, If):
            lines.append(f"{pad}if {text[id(s.cond)]}:")
            lines.extend(format_stmts(s.then, indent + 1, counter))
            if s.otherwise:
                lines.append(f"{pad}else:")
                lines.extend(format_stmts(s.otherwise, indent + 1, counter))
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
    head += [f"  packed {b}" for b in kernel.packed]
    if kernel.prepack:
        head.append("  prepack:")
        head += format_stmts(kernel.prepack, 2)
    return "\n".join(head + format_stmts(kernel.body)) + "\n"
