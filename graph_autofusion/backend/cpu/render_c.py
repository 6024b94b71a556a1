"""The C renderer of the kernel IR: one `Kernel` in, one C translation unit out.

Expressions become `const` locals in the block that first needs them, one per distinct
(interned) expression, so a value used twice is computed once and the text never explodes. Index
arithmetic stays inline (`in0[o * 56 + i3]`), which keeps unit-stride accesses visible to gcc's
vectorizer. A *guarded* select renders as if/else into a local, with each arm in a child block
whose locals die with the branch, so no read that the condition guards is hoisted above it.

Element types: values are computed in `DType.compute`; fp16 and bf16 are stored as 16 bits and
widened / narrowed (round to nearest even) at loads and stores by the prelude's helpers, which gcc
turns into F16C conversions where the target ISA has them.

Loop marks: `parallel` → an OpenMP worksharing loop (the generated code owns the parallel loop:
DESIGN.md), `vector` → `omp simd`, both → `omp parallel for simd`. libm calls that glibc's libmvec
has SIMD variants of are declared `omp declare simd`, so such loops vectorize without
-ffast-math.
"""

from __future__ import annotations

import ctypes
import math
import platform
from functools import lru_cache

import numpy as np

from ...kernel_ir import DType, Expr, Kernel, Stmt
from ...kernel_ir import nodes as ir
from ...kernel_ir.uses import names_read
from ...kernel_ir.visit import Block, ExprVisitor, StmtVisitor, fold_identity

C_TYPES = {
    DType.F64: "double",
    DType.F32: "float",
    DType.F16: "uint16_t",
    DType.BF16: "uint16_t",
    DType.I64: "int64_t",
    DType.I32: "int32_t",
    DType.I16: "int16_t",
    DType.I8: "int8_t",
    DType.U64: "uint64_t",
    DType.U32: "uint32_t",
    DType.U16: "uint16_t",
    DType.U8: "uint8_t",
    DType.BOOL: "uint8_t",
}


def c_type(dtype: DType) -> str:
    """The C type a buffer of `dtype` is stored as."""
    return C_TYPES[dtype]


def c_literal(value: object, dtype: DType) -> str:
    """A C literal of the compute type of `dtype` (INFINITY/NAN spelled out)."""
    dtype = dtype.compute
    if dtype.is_float:
        v = float(value)  # type: ignore[arg-type]
        suffix = "f" if dtype is DType.F32 else ""
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        text = repr(v) if dtype is DType.F64 else repr(float(np.float32(v)))
        return f"{text}{suffix}" if v >= 0 and not text.startswith("-") else f"({text}{suffix})"
    if dtype is DType.BOOL:
        return "1" if bool(value) else "0"
    iv = int(value)  # type: ignore[call-overload]
    if dtype is DType.I64:
        if abs(iv) < 2**31:  # an int literal: arithmetic with an int64_t operand widens it
            return str(iv) if iv >= 0 else f"({iv})"
        return f"INT64_C({iv})" if iv >= 0 else f"(-INT64_C({-iv}))"
    if dtype is DType.U64:
        return f"UINT64_C({iv})"
    return str(iv) if iv >= 0 else f"({iv})"


def c_comment(text: str) -> str:
    """A block comment of several lines (a `*/` inside the text cannot end it early)."""
    body = text.replace("*/", "* /").replace("/*", "/ *")
    return "/* " + body.replace("\n", "\n * ") + "\n */"


def _table_literals(values: object, dtype: DType) -> list[str]:
    """Initializers of a constant table stored as `c_type(dtype)`.

    16-bit floats are stored as their bits (uint16_t), so their table holds bit patterns: a float
    literal there would be converted as an integer (-INFINITY to 0), which turned an fp16 causal
    mask into zeros.
    """
    arr = np.asarray(values)
    if dtype not in (DType.F16, DType.BF16):
        return [c_literal(v, dtype) for v in arr.reshape(-1)]
    if arr.dtype.itemsize == 2 and (arr.dtype.kind in "uV" or arr.dtype == np.float16):
        bits = arr.view(np.uint16)  # already fp16 / bf16 (ml_dtypes) values, or their bits
    elif dtype is DType.F16:
        bits = arr.astype(np.float16).view(np.uint16)
    else:  # fp32 -> bf16, round to nearest even (NaN stays a quiet NaN)
        u = arr.astype(np.float32).view(np.uint32).astype(np.uint64)
        rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        bits = np.where(np.isnan(arr.astype(np.float32)), np.uint16(0x7FC0), rounded)
    return [f"0x{int(b):04x}u" for b in np.asarray(bits).reshape(-1)]


# -- prelude ----------------------------------------------------------------------------------------

# The prelude's global that the runtime sets in every loaded unit (threads.parallel_min_macs).
PARALLEL_MIN_MACS_SYMBOL = "af_parallel_min_macs"
# A kernel with a workspace: its slices, one per thread of the team the runtime runs it on (the
# lowering may size a parallel loop by it: lower/conv_chain.py).
WORKSPACE_SLICES = "af_ws_slices"
_PRELUDE = """\
#ifndef AF_PRELUDE
#define AF_PRELUDE
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
static inline int64_t af_mod(int64_t a, int64_t b) {
  int64_t r = b ? a % b : 0;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
/* max(x, floor) as a bit select: gcc sees through a plain `x < f ? f : x` feeding expf and
 * calls expf on the raw value (slow for underflowing lanes); this form it keeps. */
static inline float af_clamp_low(float x, float f) {
  uint32_t xb, fb;
  memcpy(&xb, &x, 4);
  memcpy(&fb, &f, 4);
  const uint32_t m = (x < f) ? 0xffffffffu : 0u;
  const uint32_t rb = (xb & ~m) | (fb & m);
  float r;
  memcpy(&r, &rb, 4);
  return r;
}
/* Per-thread scratch lives in the caller's workspace, one slice per thread: a team wider than
 * the slices the caller passed is a caller bug; stop loudly, never write past the workspace. */
#include <stdio.h>
#ifdef _OPENMP
#include <omp.h>
#define AF_THREAD_NUM() ((int64_t)omp_get_thread_num())
#else
#define AF_THREAD_NUM() ((int64_t)0)
#endif
/* Multiply-adds below which a parallel contraction loop (an `if` clause on its pragma) runs on
 * the calling thread alone: waking sleeping OpenMP workers costs more than such a loop saves. 0
 * (every such loop takes the team) until the runtime sets it in each loaded unit, from the wait
 * policy and the wake-up cost measured for it (backend/cpu/threads.py: parallel_min_macs). */
int64_t af_parallel_min_macs = 0;
static inline void af_workspace_short(const char *kernel, long long thread, long long slices) {
  fprintf(stderr, "graph-autofusion: kernel %s runs thread %lld but got %lld workspace slices\\n",
          kernel, thread, slices);
  abort();
}
/* 16-bit floats are stored as their bits and computed in fp32. */
#if defined(__FLT16_MAX__)
static inline float af_h2f(uint16_t h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
static inline uint16_t af_f2h(float x) { _Float16 f = (_Float16)x; uint16_t h; memcpy(&h, &f, 2); return h; }
#else
static inline float af_h2f(uint16_t h) {
  const uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  float r;
  if (e == 0) { r = ldexpf((float)m, -24); }
  else if (e == 31) { r = m ? NAN : INFINITY; }
  else { r = ldexpf((float)(m | 0x400u), (int)e - 25); }
  uint32_t b; memcpy(&b, &r, 4); b |= s; memcpy(&r, &b, 4);
  return r;
}
static inline uint16_t af_f2h(float x) {
  uint32_t b; memcpy(&b, &x, 4);
  const uint16_t s = (uint16_t)((b >> 16) & 0x8000u);
  const float a = fabsf(x);
  if (isnan(x)) return (uint16_t)(s | 0x7e00u);
  if (a >= 65520.0f) return (uint16_t)(s | 0x7c00u);
  if (a < 6.103515625e-05f) return (uint16_t)(s | (uint16_t)nearbyintf(a * 16777216.0f));
  int e; const float f = frexpf(a, &e);
  uint32_t m = (uint32_t)nearbyintf(f * 2048.0f);
  if (m == 2048u) { m = 1024u; e += 1; }
  return (uint16_t)(s | (uint16_t)((e + 14) << 10) | (uint16_t)(m & 0x3ffu));
}
#endif
static inline float af_bf2f(uint16_t h) {
  uint32_t b = (uint32_t)h << 16; float r; memcpy(&r, &b, 4); return r;
}
static inline uint16_t af_f2bf(float x) {
  uint32_t b; memcpy(&b, &x, 4);
  if (isnan(x)) return (uint16_t)((b >> 16) | 0x40u);
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}
"""
# libm functions the IR's unary/binary ops call. When glibc's vector math library (libmvec) has
# SIMD variants of one for every x86 vector ISA, the prelude declares it `omp declare simd`, so gcc
# vectorizes loops calling it (an AVX2 expf runs ~30x faster than the scalar one) without
# -ffast-math; glibc documents these variants within 4 ulp, far inside the fp32 1e-5 budget.
_UNARY_MATH = (
    "expf", "logf", "tanhf", "erff", "sinf", "cosf", "tanf", "asinf", "acosf", "atanf", "sinhf",
    "coshf", "asinhf", "acoshf", "atanhf", "expm1f", "log1pf",
)  # fmt: skip
_BINARY_MATH = ("powf",)
_ISA_VARIANTS = (("b", 4), ("c", 8), ("d", 8), ("e", 16))


@lru_cache(maxsize=1)
def vector_math_functions() -> tuple[str, ...]:
    """libm functions whose SIMD variants exist for every x86 ISA level in this host's libmvec."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ()
    try:
        lib = ctypes.CDLL("libmvec.so.1")
    except OSError:
        return ()
    found = []
    for fn in (*_UNARY_MATH, *_BINARY_MATH):
        params = "vv" if fn in _BINARY_MATH else "v"
        if all(hasattr(lib, f"_ZGV{isa}N{width}{params}_{fn}") for isa, width in _ISA_VARIANTS):
            found.append(fn)
    return tuple(found)


def prelude() -> str:
    """Includes, helpers and SIMD math declarations every generated kernel starts with."""
    lines = [_PRELUDE]
    for fn in vector_math_functions():
        args = "float, float" if fn in _BINARY_MATH else "float"
        lines.append(f"#pragma omp declare simd notinbranch\nextern float {fn}({args});\n")
    lines.append("#endif\n")
    return "".join(lines)


PRELUDE = prelude()

# -- expressions -----------------------------------------------------------------------------------


_LIBM = {  # IR unary op -> libm name (float variant gets an `f`)
    "exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "erf": "erf", "abs": "fabs",
    "floor": "floor", "ceil": "ceil", "round": "nearbyint", "sin": "sin", "cos": "cos", "tan": "tan",
    "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "asinh": "asinh",
    "acosh": "acosh", "atanh": "atanh", "expm1": "expm1", "log1p": "log1p",
}  # fmt: skip
_OMP_REDUCTION = {"sum": "+", "prod": "*", "max": "max", "min": "min"}
_INFIX = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
    "eq": "==", "ne": "!=", "and": "&&", "or": "||",
}  # fmt: skip


class ExprRenderer(ExprVisitor):
    """Renders expressions into blocks, naming each computed value once per scope."""

    target = "C"

    def bind(self, e: Expr, text: str, block: Block) -> str:
        if isinstance(e, ir.Fold):  # the accumulator: already a local
            block.memo[e] = text
            return text
        if _is_index(e) or _is_predicate(e) or _is_atom(text):
            # Index arithmetic stays inline (the vectorizer sees the unit stride), and so do
            # predicates: a 1-byte local between a compare and its select keeps a loop of
            # floats from vectorizing.
            return text
        name = self.fresh()
        block.emit(f"const {c_type(e.dtype)} {name} = {text};")
        block.memo[e] = name
        return name

    def expr_const(self, e: ir.Const, block: Block) -> str:
        return c_literal(e.value, e.dtype)

    def expr_var(self, e: ir.Var, block: Block) -> str:
        return e.name

    def expr_raw(self, e: ir.Raw, block: Block) -> str:
        return e.text

    def expr_addr(self, e: ir.Addr, block: Block) -> str:
        """A pointer argument: always inline, never a local."""
        return f"({e.buffer.name} + {self.expr(e.index, block)})"

    def expr_load(self, e: ir.Load, block: Block) -> str:
        value = f"{e.buffer.name}[{self.expr(e.index, block)}]"
        if e.buffer.dtype is DType.F16:
            return f"af_h2f({value})"
        if e.buffer.dtype is DType.BF16:
            return f"af_bf2f({value})"
        return value

    def expr_cast(self, e: ir.Cast, block: Block) -> str:
        x = self.expr(e.x, block)
        if e.dtype is DType.BOOL:
            return f"((uint8_t)({x} != 0))"
        return f"(({c_type(e.dtype)}){x})"

    def expr_select(self, e: ir.Select, block: Block) -> str:
        if e.guarded:
            return self._guarded(e, block)
        c = e.cond
        if (e.dtype is DType.F32 and isinstance(c, ir.Binary) and c.op == "lt" and c.b is e.a
                and c.a is e.b and isinstance(e.a, ir.Const)):  # fmt: skip
            # x < f ? f : x as a bit select (same result, NaN included): gcc sees through
            # the ternary (and fmaxf) feeding expf and calls the vector expf on the raw
            # value, its slow path for underflowing lanes; this form it keeps.
            return f"af_clamp_low({self.expr(e.b, block)}, {self.expr(e.a, block)})"
        return f"({self.expr(c, block)} ? {self.expr(e.a, block)} : {self.expr(e.b, block)})"

    def _guarded(self, e: ir.Select, block: Block) -> str:
        cond = self.expr(e.cond, block)
        name = self.fresh()
        block.emit(f"{c_type(e.dtype)} {name};")
        arms = []
        for arm in (e.a, e.b):
            branch = block.child()
            branch.emit(f"{name} = {self.expr(arm, branch)};")
            arms.append(branch)
        block.emit(f"if ({cond}) {{")
        block.extend(arms[0])
        block.emit("} else {")
        block.extend(arms[1])
        block.emit("}")
        return name

    def expr_fold(self, e: ir.Fold, block: Block) -> str:
        """An accumulator and its loop. Nested folds of the same combining op share one
        accumulator (a window's rows and columns: one running max, one sequential sum)."""
        acc = self.fresh("acc")
        vt = c_type(e.value.dtype)
        if e.op.startswith("arg"):
            best = self.fresh("best")
            start = self.expr(e.start, block)
            block.emit(f"{vt} {best} = 0; int64_t {acc} = {start};")
            body = self._open(e, block)
            x = self.expr(e.value, body)
            cmp = (">" if e.op.startswith("argmax") else "<") + ("=" if e.op.endswith("_last") else "")
            v = e.var.name
            body.emit(f"if ({v} == {start} || {x} {cmp} {best}) {{ {best} = {x}; {acc} = {v}; }}")
            self._close(block, [body])
            return acc
        identity = fold_identity(e.op, e.value.dtype)
        block.emit(f"{vt} {acc} = {c_literal(identity, e.value.dtype)};")
        loops, value, outer = [e], e.value, block
        while isinstance(value, ir.Fold) and value.op == e.op and value.dtype is e.dtype:
            loops.append(value)
            value = value.value
        bodies: list[Block] = []
        for f in loops:
            outer = self._open(f, outer)
            bodies.append(outer)
        self._update(e.op, acc, self.expr(value, bodies[-1]), bodies[-1])
        self._close(block, bodies)
        return acc

    def _open(self, f: ir.Fold, block: Block) -> Block:
        v = f.var.name
        start, stop = self.expr(f.start, block), self.expr(f.stop, block)
        cond, step = (f"{v} < {stop}", f"++{v}") if f.step == 1 else (f"{v} > {stop}", f"--{v}")
        block.emit(f"for (int64_t {v} = {start}; {cond}; {step}) {{")
        return block.child()

    @staticmethod
    def _close(block: Block, bodies: list[Block]) -> None:
        """Splice nested loop bodies back, innermost first."""
        for outer, inner in zip(reversed([block, *bodies[:-1]]), reversed(bodies), strict=True):
            outer.extend(inner)
            outer.emit("}")

    @staticmethod
    def _update(op: str, acc: str, x: str, block: Block) -> None:
        if op == "sum":
            block.emit(f"{acc} += {x};")
        elif op == "prod":
            block.emit(f"{acc} *= {x};")
        else:
            block.emit(f"{acc} = {x} {'>' if op == 'max' else '<'} {acc} ? {x} : {acc};")

    def expr_unary(self, e: ir.Unary, block: Block) -> str:
        x = self.expr(e.x, block)
        dtype = e.x.dtype
        if e.op == "neg":
            return f"(-{x})"
        if e.op == "not":
            return f"((uint8_t)!{x})"
        if e.op in ("isnan", "isinf"):
            return f"((uint8_t)({e.op}({x}) != 0))" if dtype.is_float else "((uint8_t)0)"
        if not dtype.is_float:
            if e.op == "abs":
                return f"({x} < 0 ? -{x} : {x})"
            if e.op in ("floor", "ceil", "round"):
                return x
            raise ValueError(f"{e.op} of {dtype.value} has no C form")
        return f"{_libm(_LIBM[e.op], dtype)}({x})"

    def expr_binary(self, e: ir.Binary, block: Block) -> str:
        a, b = self.expr(e.a, block), self.expr(e.b, block)
        dtype = e.a.dtype
        if e.op in _INFIX:  # operands are atoms, calls or parenthesized already
            return f"({a} {_INFIX[e.op]} {b})"
        if e.op == "rem":
            return f"{_libm('fmod', dtype)}({a}, {b})" if dtype.is_float else f"({a} % {b})"
        if e.op == "pow":
            return f"{_libm('pow', dtype)}({a}, {b})"
        if e.op in ("max", "min"):
            if dtype.is_float:
                return f"{_libm('f' + e.op, dtype)}({a}, {b})"
            op = ">" if e.op == "max" else "<"
            return f"({a} {op} {b} ? {a} : {b})"
        raise ValueError(f"the C renderer has no rule for binary {e.op}")


def _libm(name: str, dtype: DType) -> str:
    return name + "f" if dtype.compute is DType.F32 else name


def _is_index(e: Expr) -> bool:
    """Integer arithmetic on loop variables and constants only (no loads inside)."""
    if isinstance(e, ir.Const | ir.Var | ir.Raw):
        return True
    if isinstance(e, ir.Binary) and e.dtype is DType.I64 and e.op in ("add", "sub", "mul", "div", "rem"):
        return _is_index(e.a) and _is_index(e.b)
    return False


def _is_predicate(e: Expr) -> bool:
    """A truth value computed from others (compare, logic, not, isnan): no memory behind it."""
    return e.dtype is DType.BOOL and isinstance(e, ir.Binary | ir.Unary | ir.Cast)


def _is_atom(text: str) -> bool:
    return text.replace("_", "").isalnum() or text.startswith(("INT64_C", "(-INT64_C"))


# -- statements and kernels ------------------------------------------------------------------------


WORKSPACE_SUFFIX = "_workspace"  # `const int64_t <kernel>_workspace`: bytes of one thread's slice


def workspace_layout(kernel: Kernel) -> tuple[dict[str, int], int]:
    """Offsets of the kernel's scratch buffers in one thread's workspace slice, and the slice's
    size in bytes (0: the kernel takes no workspace), each buffer on a 64-byte boundary.

    A kernel with scratch takes two more arguments after its parameters: the workspace (the
    caller allocates it once, `threads` slices of this size) and the number of slices. Kernels
    never allocate memory themselves."""
    offsets: dict[str, int] = {}
    size = 0

    def visit(body: tuple[Stmt, ...]) -> None:
        nonlocal size
        for s in body:
            if isinstance(s, ir.Loop):
                for b in s.scratch:
                    if b.name not in offsets:
                        offsets[b.name] = size
                        size += -(-b.size * b.dtype.itemsize // 64) * 64
                visit(s.body)
            elif isinstance(s, ir.If):
                visit(s.then)
                visit(s.otherwise)

    visit(kernel.body)
    return offsets, size


PREPACK_SUFFIX = "_prepack"  # kernel_spec.py: `<kernel>_prepack` and `<kernel>_prepack_floats`
PREPACK_ONLY_SUFFIX = "_prepack_only"  # kernel_spec.py: parameters only `prepack` reads


def prepack_only(kernel: Kernel) -> tuple[int, ...]:
    """Positions of the input parameters that only `prepack` reads, never the body: weights the
    body takes in packed form alone. The body does not even declare them (so a read would not
    compile), the runtime passes NULL in their place and may release the raw weight once packed.
    Positions from 63 on are left out of the exported mask (they stay raw: safe, just not lean)."""
    if not kernel.packed:
        return ()
    body, prepack = names_read(kernel.body), names_read(kernel.prepack)
    return tuple(
        j
        for j, b in enumerate(kernel.params)
        if j < 63 and b.role == "input" and b.name in prepack and b.name not in body
    )


def packed_layout(kernel: Kernel) -> tuple[dict[str, int], int]:
    """Offsets (in floats) of the kernel's packed buffers in the packed-weights argument, and its
    size in floats (0: the kernel packs nothing), each block on a 64-byte boundary.

    A kernel with packed buffers exports `const int64_t <kernel>_prepack_floats` (that size) and
    `void <kernel>_prepack(void *const *args, float *packed)` (its `prepack` statements, run once
    by the runtime with the weights in place), and takes the packed buffer as one more argument
    right after its parameters (before the workspace), as backend/cpu/kernel_spec.py says."""
    offsets: dict[str, int] = {}
    size = 0
    for b in kernel.packed:
        if b.dtype is not DType.F32:
            raise ValueError(f"packed buffer {b.name} is {b.dtype.value}; the packed argument holds floats")
        offsets[b.name] = size
        size += -(-b.size // 16) * 16
    return offsets, size


class KernelRenderer(StmtVisitor):
    """Renders one IR kernel as a C function `void name(void *const *args)`."""

    target = "C"

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.exprs = ExprRenderer()
        self.scratch_offsets, self.workspace_bytes = workspace_layout(kernel)
        self.packed_offsets, self.packed_floats = packed_layout(kernel)

    def expr(self, e: Expr, block: Block) -> str:
        return self.exprs.expr(e, block)

    def stmt_let(self, s: ir.Let, block: Block) -> None:
        block.emit(f"const {c_type(s.var.dtype)} {s.var.name} = {self.expr(s.value, block)};")

    def stmt_declare(self, s: ir.Declare, block: Block) -> None:
        block.emit(f"{c_type(s.var.dtype)} {s.var.name} = {self.expr(s.init, block)};")

    def stmt_assign(self, s: ir.Assign, block: Block) -> None:
        block.emit(f"{s.var.name} = {self.expr(s.value, block)};")

    def stmt_store(self, s: ir.Store, block: Block) -> None:
        value = self.expr(s.value, block)
        if s.buffer.dtype is DType.F16:
            value = f"af_f2h({value})"
        elif s.buffer.dtype is DType.BF16:
            value = f"af_f2bf({value})"
        block.emit(f"{s.buffer.name}[{self.expr(ir.index(s.index), block)}] = {value};")

    def stmt_if(self, s: ir.If, block: Block) -> None:
        block.emit(f"if ({self.expr(s.cond, block)}) {{")
        then = block.child()
        self.stmts(s.then, then)
        block.extend(then)
        if s.otherwise:
            block.emit("} else {")
            other = block.child()
            self.stmts(s.otherwise, other)
            block.extend(other)
        block.emit("}")

    def stmt_call(self, s: ir.Call, block: Block) -> None:
        block.emit(f"{s.function}({', '.join(self.expr(a, block) for a in s.args)});")

    def stmt_loop(self, s: ir.Loop, block: Block) -> None:
        clauses = "".join(f" reduction({_OMP_REDUCTION[op]}:{v.name})" for op, v in s.reductions)
        # the team only for loops worth waking it (Loop.macs; af_parallel_min_macs in the prelude)
        wake = f" if({s.macs} >= {PARALLEL_MIN_MACS_SYMBOL})" if s.macs > 0 else ""
        if s.scratch:  # per-thread buffers: a parallel region around a worksharing loop
            if s.parallel:
                block.emit(f"#pragma omp parallel{wake}")
            block.emit("{")
            region = block.child()
            region.emit("const int64_t af_tid = AF_THREAD_NUM();")
            short = f'af_workspace_short("{self.kernel.name}", af_tid, {WORKSPACE_SLICES})'
            region.emit(f"if (af_tid >= {WORKSPACE_SLICES}) {short};")
            for b in s.scratch:
                t = c_type(b.dtype)
                at = f"af_ws + af_tid * {self.workspace_bytes} + {self.scratch_offsets[b.name]}"
                region.emit(f"{t} *restrict {b.name} = ({t} *)({at});")
            bounds = self._bounds(s, region)  # any local a bound needs goes before the pragma
            if s.parallel:
                region.emit(f"#pragma omp for schedule({_schedule(s)}){clauses}")
            elif s.vector:
                region.emit(f"#pragma omp simd{clauses}")
            self._for(s, bounds, region)
            block.extend(region)
            block.emit("}")
            return
        bounds = self._bounds(s, block)
        if s.parallel and s.vector:
            block.emit(f"#pragma omp parallel for simd schedule({_schedule(s)}){clauses}{wake}")
        elif s.parallel:
            block.emit(f"#pragma omp parallel for schedule({_schedule(s)}){clauses}{wake}")
        elif s.vector:
            block.emit(f"#pragma omp simd{clauses}")
        self._for(s, bounds, block)

    def _bounds(self, s: ir.Loop, block: Block) -> tuple[str, str]:
        """The loop's start and stop as C text. Rendered before the loop's pragma: a bound that
        needs a local (a `minimum`) must not land between `#pragma omp ...` and its `for`."""
        return self.expr(ir.index(s.start), block), self.expr(ir.index(s.stop), block)

    def _for(self, s: ir.Loop, bounds: tuple[str, str], block: Block) -> None:
        v = s.var.name
        start, stop = bounds
        step = f"++{v}" if s.step == 1 else f"{v} += {s.step}"
        block.emit(f"for (int64_t {v} = {start}; {v} < {stop}; {step}) {{")
        inner = block.child()
        self.stmts(s.body, inner)
        block.extend(inner)
        block.emit("}")

    def render(self) -> str:
        """The translation unit: prelude, constant tables, the function."""
        k = self.kernel
        body = Block(indent=1)
        self.stmts(k.body, body)
        parts = [prelude()]
        for buf, values in k.constants:
            data = ", ".join(_table_literals(values, buf.dtype))
            parts.append(f"static const {c_type(buf.dtype)} {buf.name}[{buf.size}] = {{{data}}};")
        parts.append("\n" + c_comment(k.description or k.name))
        if self.workspace_bytes:
            parts.append(f"const int64_t {k.name}{WORKSPACE_SUFFIX} = {self.workspace_bytes};")
        n = len(k.params)
        skipped = prepack_only(k)
        if self.packed_floats:
            parts += self._prepack()
            mask = sum(1 << j for j in skipped)
            parts.append(f"const int64_t {k.name}{PREPACK_ONLY_SUFFIX} = {mask};")
        parts.append(f"void {k.name}(void *const *args) {{")
        parts += self._params(skip=skipped)
        for b in k.packed:
            at = f"(const float *)args[{n}] + {self.packed_offsets[b.name]}"
            parts.append(f"  const float *restrict {b.name} = {at};")
        if self.workspace_bytes:
            n += 1 if self.packed_floats else 0
            parts.append(f"  char *const af_ws = (char *)args[{n}];")
            parts.append(f"  const int64_t {WORKSPACE_SLICES} = (int64_t)(intptr_t)args[{n + 1}];")
        parts.extend(body.lines)
        parts.append("}")
        return "\n".join(parts) + "\n"

    def _params(self, skip: tuple[int, ...] = ()) -> list[str]:
        lines = []
        for j, b in enumerate(self.kernel.params):
            if j in skip:
                lines.append(f"  /* args[{j}] ({b.name}): read packed only, NULL at run time */")
                continue
            t = ("const " if b.role == "input" else "") + c_type(b.dtype)
            lines.append(f"  {t} *restrict {b.name} = ({t} *)args[{j}];")
        return lines

    def _prepack(self) -> list[str]:
        """`<kernel>_prepack_floats` and `<kernel>_prepack`: the kernel's packed buffers filled
        from its parameters by its `prepack` statements."""
        k = self.kernel
        body = Block(indent=1)
        self.stmts(k.prepack, body)
        lines = [
            f"const int64_t {k.name}{PREPACK_SUFFIX}_floats = {self.packed_floats};",
            f"void {k.name}{PREPACK_SUFFIX}(void *const *args, float *af_packed) {{",
            *self._params(),
            *(f"  float *restrict {b.name} = af_packed + {self.packed_offsets[b.name]};" for b in k.packed),
            *(f"  (void){b.name};" for b in k.params),  # most parameters are not weights
            *body.lines,
            "}",
        ]
        return lines


def _schedule(s: ir.Loop) -> str:
    return "dynamic, 1" if s.dynamic else "static"


def render_kernel(kernel: Kernel) -> str:
    """The C translation unit of one kernel."""
    return KernelRenderer(kernel).render()
