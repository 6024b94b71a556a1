"""Elementwise and broadcast ops: one output element from the same-index (or broadcast) inputs.

`scalar` builds the op's formula in the kernel IR from its argument expressions (absent optional
inputs arrive as None), so every backend renders the same formula in its own language and the
element type comes from the arguments, never from the text. Transcendental functions are the IR's
libm-style ops, so results stay within fp32 rounding of onnxruntime's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..kernel_ir import DType, Expr
from ..kernel_ir import nodes as ir
from .registry import OpDef, OpKind, per_output, register

Args = Sequence[Expr | None]
Attrs = Mapping[str, object]


def _c(value: object, like: Expr) -> Expr:
    return ir.const(float(value), like.dtype)  # type: ignore[arg-type]


def _x(a: Args) -> Expr:
    x = a[0]
    assert x is not None
    return x


def _unary(op: str, fn, cost: float = 1.0) -> None:
    register(OpDef(op, OpKind.ELEMENTWISE, per_output(cost), scalar=lambda a, t, _f=fn: _f(_x(a), t)))


def _binary(op: str, fn, cost: float = 1.0) -> None:
    register(OpDef(op, OpKind.BROADCAST, per_output(cost), scalar=fn))


def _relu(x: Expr, t: Attrs) -> Expr:
    return ir.select(ir.gt(x, 0), x, 0)


def _sigmoid(x: Expr, t: Attrs) -> Expr:
    return 1.0 / (1.0 + ir.unary("exp", -x))


def _sign(x: Expr, t: Attrs) -> Expr:
    one, zero = ir.const(1, x.dtype), ir.const(0, x.dtype)
    return ir.select(ir.gt(x, zero), one, ir.select(ir.lt(x, zero), ir.const(-1, x.dtype), zero))


def _softplus(x: Expr, t: Attrs) -> Expr:
    return ir.unary("log1p", ir.unary("exp", x))


for _op, _name, _cost in [
    ("Abs", "abs", 1),
    ("Exp", "exp", 8),
    ("Log", "log", 8),
    ("Sqrt", "sqrt", 4),
    ("Tanh", "tanh", 10),
    ("Erf", "erf", 10),
    ("Floor", "floor", 1),
    ("Ceil", "ceil", 1),
    ("Round", "round", 1),
    ("Sin", "sin", 10),
    ("Cos", "cos", 10),
    ("Tan", "tan", 10),
    ("Asin", "asin", 10),
    ("Acos", "acos", 10),
    ("Atan", "atan", 10),
    ("Sinh", "sinh", 10),
    ("Cosh", "cosh", 10),
    ("Asinh", "asinh", 10),
    ("Acosh", "acosh", 10),
    ("Atanh", "atanh", 10),
    ("Not", "not", 1),
    ("IsNaN", "isnan", 1),
]:
    _unary(_op, lambda x, t, _n=_name: ir.unary(_n, x), _cost)

_unary("Neg", lambda x, t: -x)
_unary("Reciprocal", lambda x, t: 1.0 / x if x.dtype.is_float else 1 / x, 2)
_unary("Relu", _relu)
_unary("Sigmoid", _sigmoid, 10)
_unary("Sign", _sign)
_unary("Softsign", lambda x, t: x / (1.0 + ir.unary("abs", x)), 3)
_unary("Softplus", _softplus, 16)
_unary("Mish", lambda x, t: x * ir.unary("tanh", _softplus(x, t)), 30)
_unary("LeakyRelu", lambda x, t: ir.select(ir.ge(x, 0.0), x, _c(t.get("alpha", 0.01), x) * x))
_unary("Elu", lambda x, t: ir.select(ir.ge(x, 0.0), x, _c(t.get("alpha", 1.0), x) * ir.unary("expm1", x)), 8)


def _selu(x: Expr, t: Attrs) -> Expr:
    gamma = _c(t.get("gamma", 1.05070102214813232421875), x)
    alpha = _c(t.get("alpha", 1.67326319217681884765625), x)
    return gamma * ir.select(ir.gt(x, 0.0), x, alpha * ir.unary("expm1", x))


def _celu(x: Expr, t: Attrs) -> Expr:
    alpha = _c(t.get("alpha", 1.0), x)
    return ir.maximum(0.0, x) + ir.minimum(0.0, alpha * ir.unary("expm1", x / alpha))


def _hard_sigmoid(x: Expr, t: Attrs) -> Expr:
    return ir.maximum(0.0, ir.minimum(1.0, _c(t.get("alpha", 0.2), x) * x + _c(t.get("beta", 0.5), x)))


def _gelu(x: Expr, t: Attrs) -> Expr:
    if t.get("approximate", b"none") in (b"tanh", "tanh"):
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + ir.unary("tanh", inner))
    return 0.5 * x * (1.0 + ir.unary("erf", x * 0.7071067811865476))


_unary("Selu", _selu, 8)
_unary("Celu", _celu, 8)
_unary("HardSigmoid", _hard_sigmoid, 3)
_unary("HardSwish", lambda x, t: x * ir.maximum(0.0, ir.minimum(1.0, x / 6.0 + 0.5)), 4)
_unary("ThresholdedRelu", lambda x, t: ir.select(ir.gt(x, _c(t.get("alpha", 1.0), x)), x, 0.0))
_unary("Gelu", _gelu, 12)


def _isinf(x: Expr, t: Attrs) -> Expr:
    pos, neg = int(t.get("detect_positive", 1)), int(t.get("detect_negative", 1))  # type: ignore[call-overload]
    if not x.dtype.is_float or not (pos or neg):
        return ir.const(0, DType.BOOL)
    if pos and neg:
        return ir.unary("isinf", x)
    return ir.eq(x, float("inf") if pos else float("-inf"))


_unary("IsInf", _isinf)


def _clip(a: Args, t: Attrs) -> Expr:
    x = _x(a)
    lo = a[1] if len(a) > 1 and a[1] is not None else (_c(t["min"], x) if "min" in t else None)
    hi = a[2] if len(a) > 2 and a[2] is not None else (_c(t["max"], x) if "max" in t else None)
    if lo is not None:
        x = ir.select(ir.lt(x, lo), lo, x)
    if hi is not None:
        x = ir.select(ir.gt(x, hi), hi, x)
    return x


def _cast(a: Args, t: Attrs) -> Expr:
    return ir.cast(_x(a), DType.from_onnx(int(t["to"])))  # type: ignore[call-overload]


register(OpDef("Clip", OpKind.ELEMENTWISE, per_output(2), scalar=_clip))
register(OpDef("Cast", OpKind.ELEMENTWISE, per_output(0), scalar=_cast))


def _infix(op: str):
    return lambda a, t: ir.binary(op, a[0], a[1])


for _op, _ir, _cost in [
    ("Add", "add", 1),
    ("Sub", "sub", 1),
    ("Mul", "mul", 1),
    ("Div", "div", 1),
    ("Equal", "eq", 1),
    ("Less", "lt", 1),
    ("Greater", "gt", 1),
    ("LessOrEqual", "le", 1),
    ("GreaterOrEqual", "ge", 1),
    ("And", "and", 1),
    ("Or", "or", 1),
    ("Xor", "ne", 1),
]:
    _binary(_op, _infix(_ir), _cost)
_binary("Where", lambda a, t: ir.select(a[0], a[1], a[2]))  # type: ignore[arg-type]
_binary("PRelu", lambda a, t: ir.select(ir.lt(a[0], 0), a[1] * a[0], a[0]))  # type: ignore[operator]


def _pow(a: Args, t: Attrs) -> Expr:
    # Exporters write x**2 and x**3 (variance, tanh-GELU) as Pow with a constant exponent: pow
    # costs ~10x a multiply and keeps a loop from vectorizing without vector libm, so spell those out.
    x, e = _x(a), a[1]
    assert e is not None
    if isinstance(e, ir.Const) and x.dtype.is_float:
        special = {1.0: lambda: x, 2.0: lambda: x * x, 3.0: lambda: x * x * x}
        special |= {0.5: lambda: ir.unary("sqrt", x), -1.0: lambda: 1.0 / x}
        if float(e.value) in special:
            return special[float(e.value)]()
    return ir.binary("pow", x, ir.cast(e, x.dtype))


def _mod(a: Args, t: Attrs) -> Expr:
    x, y = _x(a), a[1]
    assert y is not None
    if not x.dtype.is_float:
        # C's % truncates (fmod=1); fmod=0 takes the divisor's sign. A zero divisor gives 0
        # instead of a trap, and -1 gives 0 without evaluating INT_MIN % -1 (undefined in C), so
        # the remainder is guarded by the test.
        defined = ir.ne(y, 0) if not x.dtype.is_signed else ir.logical_and(ir.ne(y, 0), ir.ne(y, -1))
        r = ir.select(defined, ir.binary("rem", x, y), 0, guarded=True)
        if int(t.get("fmod", 0)):  # type: ignore[call-overload]
            return r
        wrong_sign = ir.logical_and(ir.ne(r, 0), ir.ne(ir.lt(r, 0), ir.lt(y, 0)))
        return ir.select(wrong_sign, r + y, r)
    r = ir.binary("rem", x, y)
    if int(t.get("fmod", 0)):  # type: ignore[call-overload]
        return r
    # fmod=0 on floats: the result takes the divisor's sign, as numpy's mod does.
    return ir.select(ir.logical_and(ir.ne(r, 0.0), ir.ne(ir.lt(r, 0.0), ir.lt(y, 0.0))), r + y, r)


def _fold(op: str):
    def build(a: Args, t: Attrs) -> Expr:
        expr = _x(a)
        for arg in a[1:]:
            expr = ir.binary(op, expr, arg)  # type: ignore[arg-type]
        return expr

    return build


def _mean(a: Args, t: Attrs) -> Expr:
    total = _fold("add")(a, t)
    return total / float(len(a)) if total.dtype.is_float else total / len(a)


register(OpDef("Pow", OpKind.BROADCAST, per_output(10), scalar=_pow))
register(OpDef("Mod", OpKind.BROADCAST, per_output(2), scalar=_mod))
register(OpDef("Max", OpKind.BROADCAST, per_output(1), scalar=_fold("max")))
register(OpDef("Min", OpKind.BROADCAST, per_output(1), scalar=_fold("min")))
register(OpDef("Sum", OpKind.BROADCAST, per_output(1), scalar=_fold("add")))
register(OpDef("Mean", OpKind.BROADCAST, per_output(1), scalar=_mean))
# Inference BatchNormalization left after folding: a per-channel affine map whose parameters
# broadcast along axis 1 (not numpy's rule), so lowering gives it an index rule of its own.
register(OpDef("BatchNormalization", OpKind.BROADCAST, per_output(2), tags=frozenset({"index_rule"})))
