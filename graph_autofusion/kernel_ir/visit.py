"""What every renderer of the kernel IR shares: the walk over expressions and statements.

A renderer turns expressions into target text and statements into lines of a `Block`. Two parts
of that are the same on every target, so they live here and the renderers keep only their text:

* the expression walk (`ExprVisitor.expr`): leaves (constants, variables, raw text, addresses)
  render in place every time; any other expression renders once per scope and is then found
  again by identity (expressions are interned), so a value used twice is computed once and the
  text stays linear in the size of the DAG. What a computed value becomes (a local, or text left
  inline) is the target's `bind`;
* the dispatch: `expr(e)` calls the renderer's `expr_<node>` method (`expr_load`, `expr_fold`,
  ...) and `stmt(s)` its `stmt_<node>` (`stmt_let`, `stmt_loop`, ...). A node the target has no
  method for raises the target's `error` with one sentence (the Triton runtime then runs the
  kernel's nodes as host ops with that sentence as its reason).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import numpy as np

from .dtypes import DType
from .nodes import Addr, Const, Expr, Raw, Stmt, TensorAt, Var

LEAVES = (Const, Var, Raw, Addr, TensorAt)  # rendered in place, never bound to a name


@dataclass
class Block:
    """Lines of target text with their own memo scope (child scopes see the parent's values)."""

    INDENT: ClassVar[str] = "  "

    indent: int
    parent: Block | None = None
    # keyword-only, so that a target's block can add positional fields after `parent`
    lines: list[str] = field(default_factory=list, kw_only=True)
    memo: dict[object, str] = field(default_factory=dict, kw_only=True)

    def emit(self, line: str) -> None:
        self.lines.append(self.INDENT * self.indent + line)

    def lookup(self, key: object) -> str | None:
        block: Block | None = self
        while block is not None:
            if key in block.memo:
                return block.memo[key]
            block = block.parent
        return None

    def child(self) -> Self:
        return type(self)(self.indent + 1, self)

    def extend(self, other: Block) -> None:
        self.lines.extend(other.lines)


class _Dispatch:
    """Calls `<kind>_<node type>` of the renderer, or says the target has no rule for the node."""

    target: ClassVar[str]  # "C", "Triton": names the renderer in error sentences
    error: ClassVar[type[Exception]] = ValueError

    def _dispatch(self, kind: str, node: object, block: Block) -> Any:
        method = getattr(self, f"{kind}_{type(node).__name__.lower()}", None)
        if method is None:
            raise self.error(f"the {self.target} renderer has no rule for {type(node).__name__}")
        return method(node, block)


class ExprVisitor(_Dispatch):
    """Renders expressions into blocks through per-node `expr_<node>` methods (see the module)."""

    def __init__(self) -> None:
        self.counter = 0

    def fresh(self, prefix: str = "t") -> str:
        """A local name no other value of this renderer has."""
        self.counter += 1
        return f"{prefix}{self.counter}"

    def expr(self, e: Expr, block: Block) -> str:
        """`e` as target text: a leaf in place, anything else once per scope."""
        if isinstance(e, LEAVES):
            return self._dispatch("expr", e, block)
        found = block.lookup(e)
        if found is not None:
            return found
        return self.bind(e, self._dispatch("expr", e, block), block)

    def bind(self, e: Expr, text: str, block: Block) -> str:
        """What the computed text of `e` becomes in `block` (a named local, remembered in
        `block.memo` so the scope finds it again; or the text itself)."""
        raise NotImplementedError

    def expr_tensorat(self, e: TensorAt, block: Block) -> str:
        raise self.error(f"unresolved tensor read {e} reached the {self.target} renderer")


class StmtVisitor(_Dispatch):
    """Renders statements into blocks through per-node `stmt_<node>` methods (see the module)."""

    def stmts(self, body: tuple[Stmt, ...], block: Block) -> None:
        for s in body:
            self.stmt(s, block)

    def stmt(self, s: Stmt, block: Block) -> None:
        self._dispatch("stmt", s, block)


def fold_identity(op: str, dtype: DType) -> float | int:
    """The value a `op` (sum/prod/max/min) accumulator of `dtype` starts from."""
    if op == "sum":
        return 0
    if op == "prod":
        return 1
    if dtype.is_float:
        return -math.inf if op == "max" else math.inf
    if dtype is DType.BOOL:
        return 0 if op == "max" else 1
    info = np.iinfo(dtype.numpy)
    return int(info.min if op == "max" else info.max)
