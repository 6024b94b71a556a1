"""Which buffers a list of statements reads: the analysis behind packed-only weights.

A kernel whose body reads a weight only through its packed form (`Kernel.packed`, filled by
`prepack`) does not need the raw weight once it is packed, so the runtime can release it and pass
a null pointer in its place. That is only safe if the body provably never touches the raw
buffer; `names_read` answers it from the IR, conservatively: a `Raw` text (target code written
directly by an older generator) counts as reading every identifier it mentions.
"""

from __future__ import annotations

import re

from .nodes import Addr, Assign, Call, Declare, Expr, Fold, If, Let, Load, Loop, Raw, Stmt, Store
from .printer import children

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def names_read(body: tuple[Stmt, ...]) -> frozenset[str]:
    """Names of the buffers `body` reads: loaded from, or passed by address to a `Call` (the callee
    may read through it), plus every identifier of a `Raw` text."""
    found: set[str] = set()
    seen: set[int] = set()

    def expr(e: Expr | int) -> None:
        if not isinstance(e, Expr) or id(e) in seen:
            return
        seen.add(id(e))  # expressions are interned DAGs: visit each node once
        if isinstance(e, Load | Addr):
            found.add(e.buffer.name)
            expr(e.index)
        elif isinstance(e, Raw):
            found.update(_IDENTIFIER.findall(e.text))
        elif isinstance(e, Fold):
            expr(e.var)
        for child in children(e):
            expr(child)

    def stmts(items: tuple[Stmt, ...]) -> None:
        for s in items:
            if isinstance(s, Let | Assign):
                expr(s.value)
            elif isinstance(s, Declare):
                expr(s.init)
            elif isinstance(s, Store):
                expr(s.index)
                expr(s.value)
            elif isinstance(s, Loop):
                expr(s.start)
                expr(s.stop)
                stmts(s.body)
            elif isinstance(s, If):
                expr(s.cond)
                stmts(s.then)
                stmts(s.otherwise)
            elif isinstance(s, Call):
                for a in s.args:
                    expr(a)
            else:
                raise TypeError(f"names_read has no rule for {type(s).__name__}")

    stmts(body)
    return frozenset(found)
