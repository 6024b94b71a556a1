"""The walk renderers share: leaves in place, other values once per scope, per-node dispatch."""

from __future__ import annotations

import math

import pytest

from graph_autofusion.kernel_ir import Buffer, DType, Expr, Let
from graph_autofusion.kernel_ir import nodes as ir
from graph_autofusion.kernel_ir.visit import Block, ExprVisitor, StmtVisitor, fold_identity


class Prefix(ExprVisitor, StmtVisitor):
    """A target that writes calls in prefix form and names every computed value."""

    target = "prefix"

    def bind(self, e: Expr, text: str, block: Block) -> str:
        name = self.fresh()
        block.emit(f"{name} = {text}")
        block.memo[e] = name
        return name

    def expr_var(self, e: ir.Var, block: Block) -> str:
        return e.name

    def expr_const(self, e: ir.Const, block: Block) -> str:
        return str(e.value)

    def expr_binary(self, e: ir.Binary, block: Block) -> str:
        return f"{e.op}({self.expr(e.a, block)}, {self.expr(e.b, block)})"

    def expr_unary(self, e: ir.Unary, block: Block) -> str:
        return f"{e.op}({self.expr(e.x, block)})"

    def stmt_let(self, s: Let, block: Block) -> None:
        block.emit(f"{s.var.name} := {self.expr(s.value, block)}")


def test_a_shared_value_is_computed_once_per_scope_and_seen_by_child_scopes() -> None:
    x = ir.var("x", DType.F32)
    e = ir.unary("exp", x)
    r, top = Prefix(), Block(0)
    r.stmts((Let(ir.var("a", DType.F32), e * e),), top)
    child = top.child()
    assert r.expr(e + 1.0, child) == "t3"
    assert top.lines == ["t1 = exp(x)", "t2 = mul(t1, t1)", "a := t2"]
    assert child.lines == ["  t3 = add(t1, 1.0)"]  # exp(x) found in the parent, not recomputed
    sibling = top.child()
    assert r.expr(e + 1.0, sibling) == "t4" and sibling.lookup(e) == "t1"


def test_a_node_without_a_method_names_the_target_and_the_node() -> None:
    r = Prefix()
    with pytest.raises(ValueError, match="the prefix renderer has no rule for Load"):
        r.expr(ir.load(Buffer("in0", DType.F32, 4), 0), Block(0))
    with pytest.raises(ValueError, match=r"unresolved tensor read .* reached the prefix renderer"):
        r.expr(ir.tensor_at("x", (ir.var("i"),), DType.F32), Block(0))


def test_fold_identities() -> None:
    assert fold_identity("sum", DType.F32) == 0 and fold_identity("prod", DType.I64) == 1
    assert fold_identity("max", DType.F32) == -math.inf and fold_identity("min", DType.F16) == math.inf
    assert fold_identity("max", DType.I8) == -128 and fold_identity("min", DType.U16) == 65535
    assert (fold_identity("max", DType.BOOL), fold_identity("min", DType.BOOL)) == (0, 1)
