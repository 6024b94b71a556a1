"""Math every rendered Triton module may call, as `@triton.jit` helpers written once here.

`tl.math` covers exp, log, sqrt, sin, cos, erf, floor, ceil and abs on every backend (NVIDIA,
Ascend, and the CPU interpreter); libdevice does not exist in the interpreter or on Ascend, so the
other functions the kernel IR has are composed from those, keeping relative accuracy where a naive
formula would lose it (Kahan's forms of expm1 and log1p; tanh and sinh through expm1 near zero).
"""

from __future__ import annotations

PRELUDE = """\
import triton
import triton.language as tl


@triton.jit
def _af_expm1(x):
    u = tl.exp(x)
    um1 = u - 1.0
    # Kahan: (u - 1) * x / log(u) cancels the rounding of u; exact where u rounds to 1.
    return tl.where(u == 1.0, x, tl.where(um1 == -1.0, -1.0, um1 * x / tl.log(u)))


@triton.jit
def _af_log1p(x):
    u = 1.0 + x
    return tl.where(u == 1.0, x, tl.log(u) * x / (u - 1.0))


@triton.jit
def _af_tanh(x):
    a = tl.abs(x)
    e = _af_expm1(-2.0 * tl.minimum(a, 20.0))
    t = -e / (2.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _af_sinh(x):
    a = tl.abs(x)
    e = _af_expm1(tl.minimum(a, 89.0))
    s = 0.5 * (e + e / (e + 1.0))
    return tl.where(x < 0, -s, s)


@triton.jit
def _af_cosh(x):
    e = tl.exp(tl.abs(x))
    return 0.5 * (e + 1.0 / e)


@triton.jit
def _af_pow(a, b):
    # b * log2|a| in the operands' type; negative bases need an integer exponent.
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    b_int = tl.floor(b) == b
    b_odd = b_int & (tl.floor(b * 0.5) * 2.0 != b)
    r = tl.where((a < 0) & b_odd, -r, r)
    r = tl.where((a < 0) & (b_int == 0), float("nan"), r)
    return tl.where(b == 0.0, 1.0, r)


@triton.jit
def _af_round(x):
    # round half to even (C's nearbyint in the default rounding mode)
    r = tl.floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def _af_to_bf16(x):
    # fp32 -> bf16 rounding to nearest even, by bits (Triton's interpreter converts otherwise);
    # a NaN stays a quiet NaN.
    bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
    r = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    r = tl.where(x != x, 0x7FC0, r)
    return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _af_mul(a, b):
    return a * b
"""

#: IR unary op -> Triton expression template over `{x}` (a rendered operand).
UNARY = {
    "exp": "tl.exp({x})",
    "log": "tl.log({x})",
    "sqrt": "tl.sqrt_rn({x})",
    "erf": "tl.erf({x})",
    "floor": "tl.floor({x})",
    "ceil": "tl.ceil({x})",
    "sin": "tl.sin({x})",
    "cos": "tl.cos({x})",
    "tan": "(tl.sin({x}) / tl.cos({x}))",
    "tanh": "_af_tanh({x})",
    "sinh": "_af_sinh({x})",
    "cosh": "_af_cosh({x})",
    "expm1": "_af_expm1({x})",
    "log1p": "_af_log1p({x})",
    "round": "_af_round({x})",
    "asinh": "(tl.where({x} < 0, -1.0, 1.0) * tl.log(tl.abs({x}) + tl.sqrt_rn({x} * {x} + 1.0)))",
    "acosh": "tl.log({x} + tl.sqrt_rn({x} * {x} - 1.0))",
    "atanh": "(0.5 * _af_log1p(2.0 * {x} / (1.0 - {x})))",
}
