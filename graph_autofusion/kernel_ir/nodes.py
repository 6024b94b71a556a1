"""The kernel IR: what one generated kernel does, independent of the language it is rendered in.

A kernel is a list of statements over named buffers::

    Kernel(name, params=(Buffer in0 f32[4096], Buffer out0 f16[4096]), body=(
        Loop(o, 64, parallel=True, body=(
            Loop(i1, 64, vector=True, body=(
                Store(out0, o * 64 + i1, exp(Load(in0, o * 64 + i1)) + 1.0),)),)),))

Expressions are immutable and *interned*: building the same expression twice returns the same
object, so a renderer finds shared subexpressions by identity (and hashing a deep DAG never walks
it). Builders fold constants and drop neutral operands, so index arithmetic stays readable
(`o * 64 + i1`, not `((o * 64) + 0) + i1 * 1`).

Statements: `Let` (a named value), `Declare`/`Assign` (a mutable accumulator), `Store`, `Loop`
(extent, parallel / vector / dynamic marks), `If`, and `Call` (a contraction micro-kernel or library
routine), whose pointer arguments are `Addr` expressions (the address of a buffer element).
A kernel may also hold `packed` buffers, weights rearranged once at load by its `prepack`
statements (`Kernel`), which its body reads like any input.

Values flow in the *compute* type of their element type (`DType.compute`: fp16/bf16 compute in
fp32); `Load` widens from the buffer's storage type and `Store` narrows to it. `TensorAt` is a
tensor's value at a multi-index before lowering has resolved it to a load or to its producer's
formula; a finished kernel holds none. `Raw` is target text, used only while older generators
still speak C directly; renderers of other targets refuse it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .dtypes import DType

# -- expressions ------------------------------------------------------------------------------------

_INTERNED: weakref.WeakValueDictionary[tuple[Any, ...], Expr] = weakref.WeakValueDictionary()

UNARY_OPS = frozenset(
    {
        "neg", "not", "abs", "exp", "log", "sqrt", "tanh", "erf", "floor", "ceil", "round", "sin",
        "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "expm1",
        "log1p", "isnan", "isinf",
    }
)  # fmt: skip
# rem: the remainder of truncating division (C's % and fmod); max/min: fmax/fmin for floats.
ARITH_OPS = frozenset({"add", "sub", "mul", "div", "rem", "max", "min", "pow"})
COMPARE_OPS = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
LOGIC_OPS = frozenset({"and", "or"})
BINARY_OPS = ARITH_OPS | COMPARE_OPS | LOGIC_OPS


def _key_part(value: object) -> object:
    if isinstance(value, Expr):
        return id(value)  # children are interned and kept alive by their parent
    if isinstance(value, tuple):
        return tuple(_key_part(v) for v in value)
    if isinstance(value, float):
        return ("float", repr(value))  # keeps -0.0 apart from 0.0, and NaN equal to itself
    return value


@dataclass(frozen=True, eq=False)
class Expr:
    """A typed value. Equality is identity: interning makes equal expressions one object."""

    dtype: DType

    @classmethod
    def make(cls, *fields: Any) -> Any:
        key = (cls, *(_key_part(f) for f in fields))
        found = _INTERNED.get(key)
        if found is None:
            found = cls(*fields)
            _INTERNED[key] = found
        return found

    # Python operators build IR (==, hash stay identity: use eq()/lt()/... for comparisons).
    def __add__(self, other: ExprLike) -> Expr:
        return binary("add", self, other)

    def __radd__(self, other: ExprLike) -> Expr:
        return binary("add", other, self)

    def __sub__(self, other: ExprLike) -> Expr:
        return binary("sub", self, other)

    def __rsub__(self, other: ExprLike) -> Expr:
        return binary("sub", other, self)

    def __mul__(self, other: ExprLike) -> Expr:
        return binary("mul", self, other)

    def __rmul__(self, other: ExprLike) -> Expr:
        return binary("mul", other, self)

    def __truediv__(self, other: ExprLike) -> Expr:
        return binary("div", self, other)

    def __rtruediv__(self, other: ExprLike) -> Expr:
        return binary("div", other, self)

    def __floordiv__(self, other: ExprLike) -> Expr:  # index arithmetic on non-negative values
        return binary("div", self, other)

    def __mod__(self, other: ExprLike) -> Expr:
        return binary("rem", self, other)

    def __neg__(self) -> Expr:
        return unary("neg", self)


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: int | float

    def __str__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True, eq=False)
class Var(Expr):
    """A loop variable or a named value (Let/Declare)."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, eq=False)
class Raw(Expr):
    text: str

    def __str__(self) -> str:
        return f"raw({self.text})"


@dataclass(frozen=True)
class Buffer:
    """A kernel parameter, a compile-time constant array, scratch, or a packed weight; `size` in
    elements.

    `packed`: a weight operand rearranged once, at load, for a contraction routine (the panel
    layout of backend/cpu/contraction): a block of the one packed-weights argument that the
    kernel's `prepack` statements fill and its body only reads (`Kernel.packed`)."""

    name: str
    dtype: DType
    size: int
    role: str = "input"  # input | output | const | scratch | packed

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype.value}[{self.size}]"


@dataclass(frozen=True, eq=False)
class Load(Expr):
    buffer: Buffer
    index: Expr

    def __str__(self) -> str:
        return f"{self.buffer.name}[{self.index}]"


@dataclass(frozen=True, eq=False)
class TensorAt(Expr):
    tensor: str
    index: tuple[Expr, ...]

    def __str__(self) -> str:
        return f"{self.tensor}@[{', '.join(map(str, self.index))}]"


@dataclass(frozen=True, eq=False)
class Unary(Expr):
    op: str
    x: Expr

    def __str__(self) -> str:
        return f"{self.op}({self.x})"


@dataclass(frozen=True, eq=False)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr

    def __str__(self) -> str:
        return f"{self.op}({self.a}, {self.b})"


@dataclass(frozen=True, eq=False)
class Select(Expr):
    """cond ? a : b. `guarded`: an arm may only be evaluated when chosen (it reads out of range
    otherwise), so a renderer must not hoist it above the condition."""

    cond: Expr
    a: Expr
    b: Expr
    guarded: bool = False

    def __str__(self) -> str:
        return f"select({self.cond}, {self.a}, {self.b}{', guarded' if self.guarded else ''})"


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    x: Expr

    def __str__(self) -> str:
        return f"{self.dtype.value}({self.x})"


FOLD_OPS = frozenset({"sum", "prod", "max", "min", "argmax", "argmin", "argmax_last", "argmin_last"})


@dataclass(frozen=True, eq=False)
class Fold(Expr):
    """`value` combined with `op` over `var` = start, start+step, ... while before `stop`
    (step 1: var < stop; step -1: var > stop), in that order: the order fixes float rounding.

    sum/prod/max/min give the combined value (in `value`'s type: cast it first to accumulate
    wider); argmax/argmin give the int64 position of the first best value (`_last`: the last).
    A renderer makes it an accumulator and a loop (a pooling window, an arg-reduction, a prefix
    sum) in the block that needs the value."""

    op: str
    var: Var
    start: Expr
    stop: Expr
    value: Expr
    step: int = 1

    def __str__(self) -> str:
        by = "" if self.step == 1 else f" step {self.step}"
        return f"{self.op}({self.var} from {self.start} to {self.stop}{by}: {self.value})"


@dataclass(frozen=True, eq=False)
class Addr(Expr):
    """The address of `buffer[index]`: a pointer argument of a `Call` (a tile of an operand or of
    the output handed to a contraction routine), never a value to compute with. Its dtype is the
    buffer's element type."""

    buffer: Buffer
    index: Expr

    def __str__(self) -> str:
        return f"&{self.buffer.name}[{self.index}]"


ExprLike = Expr | int | float | bool


# -- builders ---------------------------------------------------------------------------------------


def const(value: int | float | bool, dtype: DType) -> Const:
    dtype = dtype.compute
    if dtype.is_float:
        value = float(value)
    elif dtype is DType.BOOL:
        value = int(bool(value))
    else:
        value = int(value)
    return Const.make(dtype, value)


def index(value: ExprLike) -> Expr:
    """An int64 index value (Python ints become constants)."""
    return value if isinstance(value, Expr) else const(int(value), DType.I64)


def var(name: str, dtype: DType = DType.I64) -> Var:
    return Var.make(dtype.compute, name)


def raw(text: str, dtype: DType) -> Raw:
    return Raw.make(dtype.compute, text)


def load(buffer: Buffer, at: ExprLike) -> Load:
    return Load.make(buffer.dtype.compute, buffer, index(at))


def addr(buffer: Buffer, at: ExprLike) -> Addr:
    return Addr.make(buffer.dtype.compute, buffer, index(at))


def tensor_at(tensor: str, at: tuple[Expr, ...] | list[Expr], dtype: DType) -> TensorAt:
    return TensorAt.make(dtype.compute, tensor, tuple(index(e) for e in at))


def _lift(value: ExprLike, like: Expr) -> Expr:
    return value if isinstance(value, Expr) else const(value, like.dtype)


def unary(op: str, x: Expr) -> Expr:
    if op not in UNARY_OPS:
        raise ValueError(f"unknown unary op {op!r}")
    if isinstance(x, Const) and op == "neg":
        return const(-x.value, x.dtype)
    if op == "neg" and isinstance(x, Unary) and x.op == "neg":
        return x.x
    dtype = DType.BOOL if op in ("not", "isnan", "isinf") else x.dtype
    return Unary.make(dtype, op, x)


def _fold(op: str, a: int | float, b: int | float, dtype: DType) -> Const | None:
    if dtype.is_float or not isinstance(a, int) or not isinstance(b, int):
        return None  # float folding would round differently from the target's arithmetic
    if op == "add":
        return const(a + b, dtype)
    if op == "sub":
        return const(a - b, dtype)
    if op == "mul":
        return const(a * b, dtype)
    if op in ("div", "rem") and b != 0 and a >= 0 and b > 0:
        return const(a // b if op == "div" else a % b, dtype)
    if op == "max":
        return const(max(a, b), dtype)
    if op == "min":
        return const(min(a, b), dtype)
    return None


def binary(op: str, a: ExprLike, b: ExprLike) -> Expr:
    if op not in BINARY_OPS:
        raise ValueError(f"unknown binary op {op!r}")
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        a = index(a)
    a = _lift(a, b) if not isinstance(a, Expr) else a  # type: ignore[arg-type]
    b = _lift(b, a)
    if a.dtype is not b.dtype and op not in LOGIC_OPS:
        raise TypeError(f"{op} of {a.dtype.value} and {b.dtype.value}: cast one side first")
    if isinstance(a, Const) and isinstance(b, Const):
        folded = _fold(op, a.value, b.value, a.dtype)
        if folded is not None:
            return folded
    if not a.dtype.is_float:  # neutral elements (exact only for integers: -0.0 + 0.0 is 0.0)
        if op == "add" and _is(b, 0):
            return a
        if op in ("add",) and _is(a, 0):
            return b
        if op == "sub" and _is(b, 0):
            return a
        if op == "mul" and (_is(b, 1) or _is(a, 0)):
            return a
        if op == "mul" and (_is(a, 1) or _is(b, 0)):
            return b
        if op == "div" and _is(b, 1):
            return a
        if op == "rem" and _is(b, 1):
            return const(0, a.dtype)
        nested = isinstance(a, Binary) and a.op == "add" and isinstance(a.b, Const)
        if op == "add" and isinstance(b, Const) and nested:
            return binary("add", a.a, a.b.value + b.value)  # type: ignore[attr-defined] # (x+c1)+c2
    dtype = DType.BOOL if op in COMPARE_OPS or op in LOGIC_OPS else a.dtype
    return Binary.make(dtype, op, a, b)


def _is(e: Expr, value: int) -> bool:
    return isinstance(e, Const) and e.value == value


def select(cond: Expr, a: ExprLike, b: ExprLike, guarded: bool = False) -> Expr:
    if isinstance(a, Expr):
        b = _lift(b, a)
    elif isinstance(b, Expr):
        a = _lift(a, b)
    elif isinstance(a, int) and isinstance(b, int):
        a, b = index(a), index(b)
    else:  # two Python floats say nothing of the type: 0.0 would silently become int64
        raise TypeError("select of two Python numbers other than ints: give one arm as an IR constant")
    if isinstance(cond, Const):
        return a if cond.value else b  # type: ignore[return-value]
    if a is b:
        return a  # type: ignore[return-value]
    if a.dtype is not b.dtype:  # type: ignore[union-attr]
        raise TypeError(f"select of {a.dtype.value} and {b.dtype.value}")  # type: ignore[union-attr]
    return Select.make(a.dtype, cond, a, b, guarded)  # type: ignore[union-attr]


def cast(x: Expr, dtype: DType) -> Expr:
    dtype = dtype.compute
    if x.dtype is dtype:
        return x
    if isinstance(x, Const) and not dtype.is_float and not x.dtype.is_float:
        return const(x.value, dtype)
    return Cast.make(dtype, x)


def lt(a: ExprLike, b: ExprLike) -> Expr:
    return binary("lt", a, b)


def le(a: ExprLike, b: ExprLike) -> Expr:
    return binary("le", a, b)


def gt(a: ExprLike, b: ExprLike) -> Expr:
    return binary("gt", a, b)


def ge(a: ExprLike, b: ExprLike) -> Expr:
    return binary("ge", a, b)


def eq(a: ExprLike, b: ExprLike) -> Expr:
    return binary("eq", a, b)


def ne(a: ExprLike, b: ExprLike) -> Expr:
    return binary("ne", a, b)


def maximum(a: ExprLike, b: ExprLike) -> Expr:
    return binary("max", a, b)


def minimum(a: ExprLike, b: ExprLike) -> Expr:
    return binary("min", a, b)


def logical_and(a: Expr, b: Expr) -> Expr:
    if isinstance(a, Const):
        return b if a.value else a
    if isinstance(b, Const):
        return a if b.value else b
    return binary("and", a, b)


def clamp(x: ExprLike, lo: ExprLike, hi: ExprLike) -> Expr:
    """min(max(x, lo), hi) for indices: keeps every read inside the tensor."""
    return minimum(maximum(x, lo), hi)


def substitute(
    e: Expr, leaf: Callable[[TensorAt], Expr | None], memo: dict[Expr, Expr] | None = None
) -> Expr:
    """`e` with each `TensorAt` leaf replaced by `leaf(it)` (kept where that returns None).

    `memo` (keyed by the expressions themselves, so they stay alive) carries results between
    calls that share a scope."""
    memo = {} if memo is None else memo
    found = memo.get(e)
    if found is not None:
        return found
    out: Expr
    if isinstance(e, TensorAt):
        idx = tuple(substitute(i, leaf, memo) for i in e.index)
        at = (
            e
            if all(a is b for a, b in zip(idx, e.index, strict=True))
            else TensorAt.make(e.dtype, e.tensor, idx)
        )
        out = leaf(at) or at
    elif isinstance(e, Load):
        out = Load.make(e.dtype, e.buffer, substitute(e.index, leaf, memo))
    elif isinstance(e, Addr):
        out = Addr.make(e.dtype, e.buffer, substitute(e.index, leaf, memo))
    elif isinstance(e, Unary):
        out = Unary.make(e.dtype, e.op, substitute(e.x, leaf, memo))
    elif isinstance(e, Binary):
        out = Binary.make(e.dtype, e.op, substitute(e.a, leaf, memo), substitute(e.b, leaf, memo))
    elif isinstance(e, Select):
        parts = (substitute(p, leaf, memo) for p in (e.cond, e.a, e.b))
        out = Select.make(e.dtype, *parts, e.guarded)
    elif isinstance(e, Cast):
        out = Cast.make(e.dtype, substitute(e.x, leaf, memo))
    elif isinstance(e, Fold):
        parts = (substitute(p, leaf, memo) for p in (e.start, e.stop, e.value))
        out = Fold.make(e.dtype, e.op, e.var, *parts, e.step)
    else:
        out = e
    memo[e] = out
    return out


def fold(op: str, v: Var, start: ExprLike, stop: ExprLike, value: Expr, step: int = 1) -> Expr:
    if op not in FOLD_OPS or step not in (1, -1):
        raise ValueError(f"unknown fold {op!r} step {step}")
    dtype = DType.I64 if op.startswith("arg") else value.dtype
    return Fold.make(dtype, op, v, index(start), index(stop), value, step)


# -- statements -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Let:
    var: Var
    value: Expr


@dataclass(frozen=True)
class Declare:
    """A mutable local (an accumulator), initialised to `init`."""

    var: Var
    init: Expr


@dataclass(frozen=True)
class Assign:
    var: Var
    value: Expr


@dataclass(frozen=True)
class Store:
    buffer: Buffer
    index: Expr
    value: Expr


@dataclass(frozen=True)
class Loop:
    """for var = start; var < stop; var += step: body.

    `parallel`: the iterations are split across the thread team; `vector`: they are independent
    (up to `reductions`) and unit-stride where it matters, so SIMD them. `reductions` names the
    accumulators the body updates associatively, as (op, var) with op in sum/prod/max/min.
    `scratch` buffers are private to each thread running the loop (a row buffer): each thread's
    slice of a workspace the caller allocates once and passes in, never allocated by the kernel.
    `dynamic` (with `parallel`): iterations are handed out one at a time as threads come free,
    for iterations that each do a lot (a contraction tile) on a machine where a thread may be
    descheduled for milliseconds; a static split would leave the running thread waiting.
    `macs` (with `parallel`): the multiply-adds of the whole loop, when it is a contraction's; the
    loop then runs on the calling thread alone unless that is at least the runtime's bar for
    waking the thread team (`af_parallel_min_macs`, render_c.py; backend/cpu/threads.py's
    `parallel_min_macs` says how it is measured). 0: no such check."""

    var: Var
    stop: int | Expr
    body: tuple[Stmt, ...]
    parallel: bool = False
    vector: bool = False
    start: int | Expr = 0
    step: int = 1
    reductions: tuple[tuple[str, Var], ...] = ()
    scratch: tuple[Buffer, ...] = ()
    dynamic: bool = False
    macs: int = 0


@dataclass(frozen=True)
class If:
    cond: Expr
    then: tuple[Stmt, ...]
    otherwise: tuple[Stmt, ...] = ()


@dataclass(frozen=True)
class Call:
    """A call of a contraction micro-kernel or library routine, by name, on expressions."""

    function: str
    args: tuple[Expr, ...]


Stmt = Let | Declare | Assign | Store | Loop | If | Call


@dataclass(frozen=True)
class Kernel:
    """One kernel: parameters in call order (inputs, then outputs), constant arrays, a body.

    `packed` buffers (role `packed`) are weights packed once at load rather than per call:
    `prepack` is the statements that fill them from the parameters (run once by the runtime,
    with the weights in place; outputs are not to be touched), and the body reads them. Why
    here: a constant weight is the same at every call, so rearranging it into a contraction
    routine's panel layout per tile would repeat the same work on every tile of every call."""

    name: str
    params: tuple[Buffer, ...]
    body: tuple[Stmt, ...]
    constants: tuple[tuple[Buffer, np.ndarray], ...] = field(default=(), compare=False)
    description: str = ""
    packed: tuple[Buffer, ...] = ()
    prepack: tuple[Stmt, ...] = ()
