"""Elementwise and broadcast ops: one output element from the same-index (or broadcast) inputs.

`c_expr` turns argument expressions into one C expression over `float` (or the integer type the
backend declares); absent optional inputs arrive as "". Transcendental functions use libm so the
results stay within fp32 rounding of onnxruntime's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from .registry import OpDef, OpKind, per_output, register

_CTYPES = {
    onnx.TensorProto.FLOAT: "float",
    onnx.TensorProto.DOUBLE: "double",
    onnx.TensorProto.INT64: "int64_t",
    onnx.TensorProto.INT32: "int32_t",
    onnx.TensorProto.INT8: "int8_t",
    onnx.TensorProto.UINT8: "uint8_t",
    onnx.TensorProto.BOOL: "uint8_t",
}


def ctype(elem_type: int) -> str:
    """The C type the backend uses for an ONNX element type."""
    try:
        return _CTYPES[elem_type]
    except KeyError:
        raise ValueError(
            f"no C type for ONNX element type {onnx.TensorProto.DataType.Name(elem_type)}"
        ) from None


def _f(value: object) -> str:
    return f"{float(value)!r}f".replace("inf", "INFINITY")


def _unary(op: str, template: str, cost: float = 1.0, description: str = "") -> None:
    register(
        OpDef(
            op,
            OpKind.ELEMENTWISE,
            per_output(cost),
            c_expr=lambda a, attrs=None, _t=template: _t.format(*a),
            description=description,
        )
    )


def _attr_unary(op: str, fn, cost: float = 1.0) -> None:
    register(OpDef(op, OpKind.ELEMENTWISE, per_output(cost), c_expr=fn))


def _binary(op: str, template: str, cost: float = 1.0) -> None:
    register(
        OpDef(op, OpKind.BROADCAST, per_output(cost), c_expr=lambda a, attrs=None, _t=template: _t.format(*a))
    )


def _call(template: str):
    return lambda a, attrs: template.format(
        *a, **{k: _f(v) for k, v in attrs.items() if isinstance(v, float)}
    )


for _op, _tpl, _cost in [
    ("Abs", "fabsf({0})", 1),
    ("Neg", "(-({0}))", 1),
    ("Exp", "expf({0})", 8),
    ("Log", "logf({0})", 8),
    ("Sqrt", "sqrtf({0})", 4),
    ("Reciprocal", "(1.0f / ({0}))", 2),
    ("Relu", "(({0}) > 0.0f ? ({0}) : 0.0f)", 1),
    ("Sigmoid", "(1.0f / (1.0f + expf(-({0}))))", 10),
    ("Tanh", "tanhf({0})", 10),
    ("Erf", "erff({0})", 10),
    ("Floor", "floorf({0})", 1),
    ("Ceil", "ceilf({0})", 1),
    ("Round", "nearbyintf({0})", 1),
    ("Sign", "(float)((({0}) > 0) - (({0}) < 0))", 1),
    ("Sin", "sinf({0})", 10),
    ("Cos", "cosf({0})", 10),
    ("Tan", "tanf({0})", 10),
    ("Asin", "asinf({0})", 10),
    ("Acos", "acosf({0})", 10),
    ("Atan", "atanf({0})", 10),
    ("Sinh", "sinhf({0})", 10),
    ("Cosh", "coshf({0})", 10),
    ("Asinh", "asinhf({0})", 10),
    ("Acosh", "acoshf({0})", 10),
    ("Atanh", "atanhf({0})", 10),
    ("Not", "(!({0}))", 1),
    ("IsNaN", "isnan({0})", 1),
    ("Softsign", "(({0}) / (1.0f + fabsf({0})))", 3),
    ("Softplus", "log1pf(expf({0}))", 16),
    ("Mish", "(({0}) * tanhf(log1pf(expf({0}))))", 30),
]:
    _unary(_op, _tpl, _cost)

_attr_unary(
    "LeakyRelu", lambda a, t: f"(({a[0]}) >= 0.0f ? ({a[0]}) : {_f(t.get('alpha', 0.01))} * ({a[0]}))"
)
_attr_unary(
    "Elu", lambda a, t: f"(({a[0]}) >= 0.0f ? ({a[0]}) : {_f(t.get('alpha', 1.0))} * expm1f({a[0]}))", 8
)
_attr_unary(
    "Selu",
    lambda a, t: (
        f"({_f(t.get('gamma', 1.05070102214813232421875))} * (({a[0]}) > 0.0f ? ({a[0]}) : "
        f"{_f(t.get('alpha', 1.67326319217681884765625))} * expm1f({a[0]})))"
    ),
    8,
)
_attr_unary(
    "Celu",
    lambda a, t: (
        f"fmaxf(0.0f, {a[0]}) + fminf(0.0f, {_f(t.get('alpha', 1.0))} * "
        f"expm1f(({a[0]}) / {_f(t.get('alpha', 1.0))}))"
    ),
    8,
)
_attr_unary(
    "HardSigmoid",
    lambda a, t: f"fmaxf(0.0f, fminf(1.0f, {_f(t.get('alpha', 0.2))} * ({a[0]}) + {_f(t.get('beta', 0.5))}))",
    3,
)
_attr_unary("HardSwish", lambda a, t: f"(({a[0]}) * fmaxf(0.0f, fminf(1.0f, ({a[0]}) / 6.0f + 0.5f)))", 4)
_attr_unary("ThresholdedRelu", lambda a, t: f"(({a[0]}) > {_f(t.get('alpha', 1.0))} ? ({a[0]}) : 0.0f)")
_attr_unary(
    "Gelu",
    lambda a, t: (
        f"(0.5f * ({a[0]}) * (1.0f + tanhf(0.7978845608028654f * "
        f"(({a[0]}) + 0.044715f * ({a[0]}) * ({a[0]}) * ({a[0]})))))"
        if t.get("approximate", b"none") in (b"tanh", "tanh")
        else f"(0.5f * ({a[0]}) * (1.0f + erff(({a[0]}) * 0.7071067811865476f)))"
    ),
    12,
)


def _clip(a: Sequence[str], t: Mapping[str, object]) -> str:
    lo = a[1] if len(a) > 1 and a[1] else (_f(t["min"]) if "min" in t else "")
    hi = a[2] if len(a) > 2 and a[2] else (_f(t["max"]) if "max" in t else "")
    expr = a[0]
    if lo:
        expr = f"(({expr}) < ({lo}) ? ({lo}) : ({expr}))"
    if hi:
        expr = f"(({expr}) > ({hi}) ? ({hi}) : ({expr}))"
    return expr


register(OpDef("Clip", OpKind.ELEMENTWISE, per_output(2), c_expr=_clip))
register(
    OpDef("Cast", OpKind.ELEMENTWISE, per_output(0), c_expr=lambda a, t: f"(({ctype(int(t['to']))})({a[0]}))")
)
# IsInf and Mod depend on attributes and on the element type (fmod=0 follows the divisor's sign
# for floats, C's `%` for integers): the backend emits them with node rules, not a C expression.
register(OpDef("IsInf", OpKind.ELEMENTWISE, per_output(1), tags=frozenset({"node_rule"})))

for _op, _tpl, _cost in [
    ("Add", "(({0}) + ({1}))", 1),
    ("Sub", "(({0}) - ({1}))", 1),
    ("Mul", "(({0}) * ({1}))", 1),
    ("Div", "(({0}) / ({1}))", 1),
    ("Equal", "(({0}) == ({1}))", 1),
    ("Less", "(({0}) < ({1}))", 1),
    ("Greater", "(({0}) > ({1}))", 1),
    ("LessOrEqual", "(({0}) <= ({1}))", 1),
    ("GreaterOrEqual", "(({0}) >= ({1}))", 1),
    ("And", "(({0}) && ({1}))", 1),
    ("Or", "(({0}) || ({1}))", 1),
    ("Xor", "((!!({0})) != (!!({1})))", 1),
    ("Where", "(({0}) ? ({1}) : ({2}))", 1),
    ("PRelu", "(({0}) < 0.0f ? ({1}) * ({0}) : ({0}))", 1),
]:
    _binary(_op, _tpl, _cost)


def _literal(expr: str) -> float | None:
    """The value of a C float literal such as `3.0f` (constants arrive inlined), else None."""
    try:
        return float(expr.strip().strip("()").rstrip("f"))
    except ValueError:
        return None


def _pow(a: Sequence[str], t: Mapping[str, object]) -> str:
    # Exporters write x**2 and x**3 (variance, tanh-GELU) as Pow with a constant exponent: powf
    # costs ~10x a multiply and keeps gcc from vectorizing without libmvec, so spell those out.
    e = _literal(a[1])
    special = {
        1.0: f"({a[0]})",
        2.0: f"(({a[0]}) * ({a[0]}))",
        3.0: f"(({a[0]}) * ({a[0]}) * ({a[0]}))",
        0.5: f"sqrtf({a[0]})",
        -1.0: f"(1.0f / ({a[0]}))",
    }
    return special.get(e, f"powf({a[0]}, {a[1]})") if e is not None else f"powf({a[0]}, {a[1]})"


register(OpDef("Pow", OpKind.BROADCAST, per_output(10), c_expr=_pow))


def _fold(fn: str):
    def emit(a: Sequence[str], t: Mapping[str, object]) -> str:
        expr = a[0]
        for arg in a[1:]:
            expr = f"{fn}({expr}, {arg})"
        return expr

    return emit


register(OpDef("Max", OpKind.BROADCAST, per_output(1), c_expr=_fold("fmaxf")))
register(OpDef("Min", OpKind.BROADCAST, per_output(1), c_expr=_fold("fminf")))
register(
    OpDef(
        "Sum",
        OpKind.BROADCAST,
        per_output(1),
        c_expr=lambda a, t: "(" + " + ".join(f"({x})" for x in a) + ")",
    )
)
register(
    OpDef(
        "Mean",
        OpKind.BROADCAST,
        per_output(1),
        c_expr=lambda a, t: "((" + " + ".join(f"({x})" for x in a) + f") / {len(a)}.0f)",
    )
)
register(OpDef("Mod", OpKind.BROADCAST, per_output(2), tags=frozenset({"node_rule"})))
# Inference BatchNormalization left after folding: a per-channel affine map whose parameters
# broadcast along axis 1 (not numpy's rule), so the backend emits it with a node rule.
register(OpDef("BatchNormalization", OpKind.BROADCAST, per_output(2), tags=frozenset({"node_rule"})))
