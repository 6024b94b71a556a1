"""The Triton renderer of the kernel IR: one `Kernel` in, Triton (Python) source and its launches out.

The IR speaks of scalar loops; Triton of programs working on blocks. Each top-level loop nest of
a kernel becomes one `@triton.jit` function (one launch), shaped by what the nest is:

* **flat** — a loop whose body is lets and one innermost `vector` loop (the pointwise nest of
  lower/pointwise.py): the two loops are flattened, each program takes `BLOCK` consecutive points
  (`f = block * BLOCK + tl.arange(0, BLOCK)`, outer index `f // inner`, inner `f % inner`) under
  the mask `f < total`;
* **row** — any other loop (the row template of lower/reduction.py): one program per iteration of
  the outer loop, whose body runs as written: scalar loops stay loops, and every `vector` loop
  becomes one block of lanes. A chunked row loop (`for jb in 0..n step B: je = min(jb + B, n)`) is
  re-chunked by `RBLOCK`, the target's row block. Accumulators a vector loop reduces are folded
  over its lanes (`tl.sum`, `tl.max`, ...) and combined with their running value once per chunk;
* **scalar** — statements outside any loop: one program.

On Ascend the grid may not exceed the AI cores, so functions are rendered *persistent*: program
`p` of `P` walks the blocks `p, p + P, ...`; on CUDA each program takes one block.

Values are rendered by the walk the C renderer shares (kernel_ir/visit.py: one local per distinct
interned expression, in the block that first needs it). Loads are masked with the lane mask of
their block; a *guarded* select evaluates each arm with its condition folded into that mask, so no
out-of-range address is read.
A `Fold` (pooling window, ArgMax, CumSum) becomes a scalar loop over the union of its lanes' ranges
(bounds folded with `tl.min`/`tl.max` when they differ per lane), each lane masked to its own range.

fp16/bf16 load widened to fp32 and store rounded back; 64-bit float accumulators narrow to fp32 on
targets without fp64 (Ascend). Anything the renderer has no rule for raises `Unsupported`, and the
runtime runs that kernel's nodes as host ops with the sentence as its reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ...kernel_ir import Buffer, DType, Expr, Kernel, Stmt
from ...kernel_ir import nodes as ir
from ...kernel_ir.visit import Block as BaseBlock
from ...kernel_ir.visit import ExprVisitor, StmtVisitor, fold_identity
from ...lower.values import Unsupported
from .prelude import PRELUDE, UNARY

TL_TYPES = {
    DType.F64: "tl.float64",
    DType.F32: "tl.float32",
    DType.F16: "tl.float16",
    DType.BF16: "tl.bfloat16",
    DType.I64: "tl.int64",
    DType.I32: "tl.int32",
    DType.I16: "tl.int16",
    DType.I8: "tl.int8",
    DType.U64: "tl.uint64",
    DType.U32: "tl.uint32",
    DType.U16: "tl.uint16",
    DType.U8: "tl.uint8",
    DType.BOOL: "tl.int1",
}
_INFIX = {
    "add": "+", "sub": "-", "mul": "*", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==",
    "ne": "!=", "and": "&", "or": "|",
}  # fmt: skip
_REDUCE = {"sum": "tl.sum({x}, 0)", "max": "tl.max({x}, 0)", "min": "tl.min({x}, 0)",
           "prod": "tl.reduce({x}, 0, _af_mul)"}  # fmt: skip
_COMBINE = {"sum": "({a} + {b})", "prod": "({a} * {b})", "max": "tl.maximum({a}, {b})",
            "min": "tl.minimum({a}, {b})"}  # fmt: skip


@dataclass(frozen=True)
class Launch:
    """One `@triton.jit` function of a rendered kernel and how to launch it.

    `kind`: flat (grid over `ceil(extent / BLOCK)` blocks), row (`extent` programs, each walking
    its row in chunks of RBLOCK) or scalar (one program). `args` names the buffers passed, in
    order; `lane_bytes` is what one lane of a block holds (every block-sized value the function
    keeps, in bytes), so a block of B lanes needs about `lane_bytes * B` bytes of on-chip memory.
    """

    function: str
    kind: str
    extent: int
    args: tuple[str, ...]
    lane_bytes: int
    row_blocks: bool = False  # a row function with chunked vector loops (takes RBLOCK)
    row_length: int = 0  # the longest row it walks in chunks
    tile: tuple[int, ...] = ()  # gemm: (batch, M, N, K)


@dataclass(frozen=True)
class RenderedKernel:
    """A kernel as Triton source: the module text, its launches, and the buffers it needs."""

    name: str
    source: str
    launches: tuple[Launch, ...]
    params: tuple[Buffer, ...]  # inputs then outputs, as the IR kernel's params
    constants: tuple[tuple[Buffer, object], ...]  # tables passed as extra inputs
    scratch: tuple[tuple[Buffer, int], ...]  # (buffer, copies): global scratch of size*copies


@dataclass
class Block(BaseBlock):
    """Lines of Python source with their own memo scope and lane mask."""

    INDENT: ClassVar[str] = "    "

    mask: str | None = None  # the lane mask loads and stores of this block are predicated on
    scalar_mask: str | None = None  # the part of `mask` that is one truth value for all lanes
    lane_guard: bool = False  # `mask` holds a per-lane guard beyond the lanes' own bounds

    def child(self, mask: str | None = None, indent: int = 1) -> Block:
        return Block(
            self.indent + indent,
            self,
            self.mask if mask is None else mask,
            scalar_mask=self.scalar_mask,
            lane_guard=self.lane_guard,
        )


def _and(a: str | None, b: str | None) -> str | None:
    if a is None:
        return b
    if b is None:
        return a
    return f"({a}) & ({b})"


def _float_text(value: float) -> str:
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    return repr(float(value))


class FunctionRenderer(ExprVisitor, StmtVisitor):
    """Renders one launch (one top-level nest) as a `@triton.jit` function."""

    target = "Triton"
    error = Unsupported

    def __init__(self, owner: KernelRenderer, name: str) -> None:
        super().__init__()
        self.owner = owner
        self.name = name
        self.vec: dict[str, DType] = {}  # names that hold block-shaped values, with their type
        self.vec_vars: set[str] = set()  # IR variables bound to lanes
        self.lane_shape = "[BLOCK]"
        self.lane_vars_of_loop: dict[str, str] = {}  # reduction var -> its lane accumulator
        self.uses_rblock = False
        self.row_length = 0  # longest chunked row loop (what RBLOCK needs to cover)
        self.bases: dict[str, str] = {}  # scratch buffer -> base offset expression
        self.full_lanes = False  # broadcast every address to the lane shape (2-D tiles of anchors)

    # -- naming -------------------------------------------------------------------------------------
    def tl_type(self, dtype: DType) -> str:
        if dtype is DType.F64 and self.owner.narrow_f64:
            return "tl.float32"
        return TL_TYPES[dtype]

    def var_name(self, v: ir.Var) -> str:
        return self.lane_vars_of_loop.get(v.name, f"v_{v.name}")

    def is_vec(self, e: Expr) -> bool:
        """Whether `e` has the block's shape (depends on a lane variable or a lane-shaped local)."""
        state = (frozenset(self.vec_vars), frozenset(self.lane_vars_of_loop))
        memo = self.owner.vec_memo.setdefault(state, {})
        return self._is_vec(e, state[0] | state[1], memo)

    def _is_vec(self, e: Expr, lanes: frozenset[str], memo: dict[Expr, bool]) -> bool:
        found = memo.get(e)  # keyed by the expression itself: it stays alive, its id is not reused
        if found is not None:
            return found
        if isinstance(e, ir.Var):
            out = e.name in lanes
        elif isinstance(e, ir.Const | ir.Raw):
            out = False
        elif isinstance(e, ir.Load):
            out = self._is_vec(e.index, lanes, memo)
        elif isinstance(e, ir.Unary | ir.Cast):
            out = self._is_vec(e.x, lanes, memo)
        elif isinstance(e, ir.Binary):
            out = self._is_vec(e.a, lanes, memo) or self._is_vec(e.b, lanes, memo)
        elif isinstance(e, ir.Select):
            out = any(self._is_vec(x, lanes, memo) for x in (e.cond, e.a, e.b))
        elif isinstance(e, ir.Fold):
            out = any(self._is_vec(x, lanes, memo) for x in (e.start, e.stop, e.value))
        else:
            out = False
        memo[e] = out
        return out

    # -- expressions --------------------------------------------------------------------------------
    def bind(self, e: Expr, text: str, block: Block) -> str:
        name = self.fresh()
        block.emit(f"{name} = {text}")
        if self.is_vec(e):
            self.vec[name] = e.dtype
        block.memo[e] = name
        return name

    def expr_const(self, e: ir.Const, block: Block) -> str:
        if e.dtype.is_float:
            return _float_text(float(e.value))
        if e.dtype is DType.BOOL:
            return "True" if e.value else "False"
        return str(int(e.value))

    def expr_var(self, e: ir.Var, block: Block) -> str:
        return self.var_name(e)

    def expr_raw(self, e: ir.Raw, block: Block) -> str:
        raise Unsupported("target text (Raw) in the kernel IR has no Triton form")

    def typed_const(self, value: float | int, dtype: DType) -> str:
        text = _float_text(float(value)) if dtype.is_float else str(int(value))
        if dtype is DType.BOOL:
            text = "1" if value else "0"
        return f"tl.full([], {text}, {self.tl_type(dtype)})"

    def tensor(self, e: Expr, block: Block) -> str:
        """`e` as a Triton tensor (a bare literal has no `.to` or dtype)."""
        if isinstance(e, ir.Const):
            return self.typed_const(e.value, e.dtype)
        return self.expr(e, block)

    def expr_load(self, e: ir.Load, block: Block) -> str:
        buf = e.buffer
        ptr = self.owner.pointer(buf)
        base = self.bases.get(buf.name)
        index = self.expr(e.index, block)
        addr = f"{ptr} + {base} + {index}" if base else f"{ptr} + {index}"
        if self.full_lanes and block.mask is not None:
            mask = block.mask
            addr = f"{addr} + tl.zeros({self.lane_shape}, tl.int64)"
        elif self.is_vec(e.index):
            mask = block.mask
        elif block.lane_guard:  # one address, read only in the lanes whose guard holds
            mask = block.mask
            addr = f"{addr} + tl.zeros({self.lane_shape}, tl.int64)"
        else:
            mask = block.scalar_mask
        text = f"tl.load({addr}, mask={mask}, other=0)" if mask else f"tl.load({addr})"
        if buf.dtype in (DType.F16, DType.BF16):
            text = f"{text}.to(tl.float32)"
        elif buf.dtype is DType.F64 and self.owner.narrow_f64:
            raise Unsupported("fp64 tensors on a target without fp64")
        return text

    def expr_cast(self, e: ir.Cast, block: Block) -> str:
        if e.dtype is DType.BOOL:
            return f"({self.expr(e.x, block)} != 0)"
        if isinstance(e.x, ir.Const):
            return self.typed_const(e.x.value, e.dtype)
        return f"{self.tensor(e.x, block)}.to({self.tl_type(e.dtype)})"

    def expr_select(self, e: ir.Select, block: Block) -> str:
        if e.guarded:
            return self.guarded(e, block)
        return f"tl.where({self.expr(e.cond, block)}, {self.expr(e.a, block)}, {self.expr(e.b, block)})"

    def expr_unary(self, e: ir.Unary, block: Block) -> str:
        dtype = e.x.dtype
        if e.op == "neg":
            return f"(-{self.tensor(e.x, block)})"
        if e.op == "not":
            return f"({self.expr(e.x, block)} == 0)"
        if e.op == "isnan":
            x = self.tensor(e.x, block)
            return f"({x} != {x})" if dtype.is_float else f"({x} != {x}) & False"
        if e.op == "isinf":
            x = self.tensor(e.x, block)
            return f'(tl.abs({x}) == float("inf"))' if dtype.is_float else f"({x} != {x}) & False"
        if e.op == "abs":
            return f"tl.abs({self.tensor(e.x, block)})"
        if not dtype.is_float:
            if e.op in ("floor", "ceil", "round"):
                return self.expr(e.x, block)
            raise Unsupported(f"{e.op} of {dtype.value} has no Triton form")
        if e.op == "sqrt" and dtype is DType.F64:
            return f"tl.sqrt({self.tensor(e.x, block)})"
        template = UNARY.get(e.op)
        if template is None:
            raise Unsupported(f"unary {e.op} has no Triton form")
        return template.format(x=self.tensor(e.x, block))

    def expr_binary(self, e: ir.Binary, block: Block) -> str:
        dtype = e.a.dtype
        a, b = self.expr(e.a, block), self.expr(e.b, block)
        if e.op in _INFIX:
            return f"({a} {_INFIX[e.op]} {b})"
        if e.op == "div":
            return f"({a} / {b})" if dtype.is_float else f"({a} // {b})"
        if e.op == "rem":
            return f"({a} % {b})"
        if e.op == "pow":
            if not dtype.is_float:
                raise Unsupported("integer pow has no Triton form")
            return f"_af_pow({self.tensor(e.a, block)}, {self.tensor(e.b, block)})"
        if e.op in ("max", "min"):
            fn = "tl.maximum" if e.op == "max" else "tl.minimum"
            if isinstance(e.a, ir.Const) and isinstance(e.b, ir.Const):
                return f"{fn}({self.tensor(e.a, block)}, {b})"
            return f"{fn}({a}, {b})"
        raise Unsupported(f"binary {e.op} has no Triton form")

    def guarded(self, e: ir.Select, block: Block) -> str:
        cond = self.expr(e.cond, block)
        arms = []
        for arm, guard in ((e.a, cond), (e.b, f"({cond} == 0)")):
            # Arms render into the enclosing block (Triton has no per-lane branches) but in a scope
            # whose loads are also predicated on the arm's condition.
            lane = self.is_vec(e.cond)
            child = Block(
                block.indent,
                block,
                _and(block.mask, guard),
                scalar_mask=block.scalar_mask if lane else _and(block.scalar_mask, guard),
                lane_guard=block.lane_guard or lane,
            )
            child.lines = block.lines  # same text, separate memo: the arm's values stay its own
            arms.append(self.expr(arm, child))
        return f"tl.where({cond}, {arms[0]}, {arms[1]})"

    def expr_fold(self, e: ir.Fold, block: Block) -> str:
        vec = self.is_vec(e)
        shape = self.lane_shape if vec else "[]"
        value_type = self.tl_type(e.value.dtype)
        start, stop = self.expr(e.start, block), self.expr(e.stop, block)
        ranged = self.is_vec(e.start) or self.is_vec(e.stop)
        fv = f"v_{e.var.name}"
        if ranged:  # lanes with their own ranges: walk the union, mask each lane to its own
            lo, hi = self.fresh("lo"), self.fresh("hi")
            m = block.mask or "True"
            if e.step == 1:
                block.emit(f"{lo} = tl.min(tl.where({m}, {start}, 2**31 - 1), 0)")
                block.emit(f"{hi} = tl.max(tl.where({m}, {stop}, -(2**31 - 1)), 0)")
            else:
                block.emit(f"{hi} = tl.max(tl.where({m}, {start}, -(2**31 - 1)), 0)")
                block.emit(f"{lo} = tl.min(tl.where({m}, {stop}, 2**31 - 1), 0)")
        else:
            lo, hi = (start, stop) if e.step == 1 else (stop, start)
        acc = self.fresh("acc")
        best = self.fresh("best") if e.op.startswith("arg") else None
        if best is not None:
            block.emit(f"{best} = tl.zeros({shape}, {value_type})")
            block.emit(f"{acc} = tl.zeros({shape}, tl.int64) + {start}")
            if vec:
                self.vec[best] = e.value.dtype
        else:
            ident = fold_identity(e.op, e.value.dtype)
            block.emit(f"{acc} = tl.full({shape}, {_ident_text(ident, e.value.dtype)}, {value_type})")
        if e.step == 1:
            block.emit(f"for {fv} in range({lo}, {hi}):")
        else:
            step_var = self.fresh("n")
            block.emit(f"for {step_var} in range(0, {hi} - {lo}):")
        body = block.child(mask=block.mask)
        if e.step != 1:
            body.emit(f"{fv} = {hi} - {step_var}")
        act = None
        if ranged:
            act = self.fresh("act")
            inside = (
                f"({fv} >= {start}) & ({fv} < {stop})"
                if e.step == 1
                else f"({fv} <= {start}) & ({fv} > {stop})"
            )
            body.emit(f"{act} = {_and(block.mask, inside)}")
            body.mask = act
            body.lane_guard = True
        x = self.tensor(e.value, body)
        if best is not None:
            cmp = (">" if e.op.startswith("argmax") else "<") + ("=" if e.op.endswith("_last") else "")
            upd = self.fresh("upd")
            body.emit(f"{upd} = ({fv} == {start}) | ({x} {cmp} {best})")
            if act:
                body.emit(f"{upd} = {upd} & {act}")
            body.emit(f"{best} = tl.where({upd}, {x}, {best})")
            body.emit(f"{acc} = tl.where({upd}, {fv}, {acc})")
        else:
            combined = _COMBINE[e.op].format(a=acc, b=x)
            body.emit(f"{acc} = tl.where({act}, {combined}, {acc})" if act else f"{acc} = {combined}")
        block.extend(body)
        if vec:
            self.vec[acc] = e.dtype
        return acc

    # -- statements ---------------------------------------------------------------------------------
    def stmt_let(self, s: ir.Let, block: Block) -> None:
        value = self.expr(s.value, block)
        name = self.var_name(s.var)
        block.emit(f"{name} = {value}")
        if self.is_vec(s.value):
            self.vec_vars.add(s.var.name)
            self.vec[name] = s.var.dtype

    def stmt_declare(self, s: ir.Declare, block: Block) -> None:
        init = s.init
        text = self.typed_const(init.value, s.var.dtype) if isinstance(init, ir.Const) else (
            f"{self.tensor(init, block)}.to({self.tl_type(s.var.dtype)})")  # fmt: skip
        block.emit(f"{self.var_name(s.var)} = {text}")

    def stmt_assign(self, s: ir.Assign, block: Block) -> None:
        if s.var.name in self.lane_vars_of_loop:
            lanes = self.lane_vars_of_loop[s.var.name]
            value = self.tensor(s.value, block)
            block.emit(f"{lanes} = tl.where({block.mask}, {value}, {lanes})")
            return
        if self.is_vec(s.value):
            raise Unsupported(f"{s.var.name} is assigned a per-lane value outside a reduction")
        value = self.tensor(s.value, block)
        block.emit(f"{self.var_name(s.var)} = {value}.to({self.tl_type(s.var.dtype)})")

    def stmt_if(self, s: ir.If, block: Block) -> None:
        if self.is_vec(s.cond):
            raise Unsupported("a per-lane if statement")
        block.emit(f"if {self.expr(s.cond, block)}:")
        then = block.child()
        then.emit("pass")
        self.stmts(s.then, then)
        block.extend(then)
        if s.otherwise:
            block.emit("else:")
            other = block.child()
            other.emit("pass")
            self.stmts(s.otherwise, other)
            block.extend(other)

    def stmt_call(self, s: ir.Call, block: Block) -> None:
        raise Unsupported(f"a call of {s.function} (a contraction micro-kernel) in the kernel IR")

    def stmt_store(self, s: ir.Store, block: Block) -> None:
        buf = s.buffer
        value = self.tensor(s.value, block)
        if buf.dtype is DType.BOOL:
            value = f"({value} != 0)"
        elif buf.dtype is DType.F64 and self.owner.narrow_f64:
            raise Unsupported("fp64 tensors on a target without fp64")
        elif buf.dtype is DType.BF16:
            value = f"_af_to_bf16({value})"  # round to nearest even on every backend
        else:
            value = f"{value}.to({TL_TYPES[buf.dtype]})"
        index = self.expr(s.index, block)
        base = self.bases.get(buf.name)
        addr = (
            f"{self.owner.pointer(buf)} + {base} + {index}"
            if base
            else f"{self.owner.pointer(buf)} + {index}"
        )
        vec = self.is_vec(s.index) or self.is_vec(s.value)
        if vec and not self.is_vec(s.index):
            raise Unsupported("a per-lane value stored at one address")
        mask = block.mask if vec else block.scalar_mask
        if self.full_lanes:
            addr = f"{addr} + tl.zeros({self.lane_shape}, tl.int64)"
        block.emit(f"tl.store({addr}, {value}, mask={mask})" if mask else f"tl.store({addr}, {value})")

    def stmt_loop(self, s: ir.Loop, block: Block) -> None:
        if s.scratch:
            raise Unsupported("per-thread scratch below the outermost loop")
        if s.vector:
            self.vector_loop(s, block)
            return
        if self.is_vec(_as_expr(s.start)) or self.is_vec(_as_expr(s.stop)):
            raise Unsupported("a loop whose bounds differ per lane")
        v = self.var_name(s.var)
        chunk = _chunk_of(s)
        start = self.expr(_as_expr(s.start), block)
        stop = self.expr(_as_expr(s.stop), block)
        if chunk is not None:  # re-chunk by the target's row block
            self.uses_rblock = True
            if isinstance(s.stop, int):
                self.row_length = max(self.row_length, s.stop)
            block.emit(f"for {v} in range({start}, {stop}, RBLOCK):")
            body = block.child()
            je = self.var_name(chunk.var)
            body.emit(f"{je} = tl.minimum({v} + RBLOCK, {stop})")
            self.stmts(s.body[1:], body)
        else:
            block.emit(f"for {v} in range({start}, {stop}, {s.step}):")
            body = block.child()
            self.stmts(s.body, body)
        block.extend(body)

    def vector_loop(self, s: ir.Loop, block: Block) -> None:
        if self.vec_vars or self.lane_vars_of_loop:
            raise Unsupported("nested vector loops")
        if s.step != 1:
            raise Unsupported("a strided vector loop")
        start, stop = _as_expr(s.start), _as_expr(s.stop)
        if isinstance(start, ir.Var) and isinstance(stop, ir.Var) and self.uses_rblock:
            width = "RBLOCK"
        elif isinstance(start, ir.Const) and isinstance(stop, ir.Const):
            n = int(stop.value) - int(start.value)
            width = str(max(1, 1 << max(0, (n - 1).bit_length())))
        else:
            raise Unsupported("a vector loop of unknown width")
        v = self.var_name(s.var)
        body = block.child(indent=0)
        mask = self.fresh("m")
        body.emit(f"{v} = {self.expr(start, block)} + tl.arange(0, {width})")
        body.emit(f"{mask} = {_and(block.mask, f'{v} < {self.expr(stop, block)}')}")
        body.mask = mask
        saved, saved_vars = self.lane_shape, set(self.vec_vars)
        self.lane_shape = f"[{width}]"
        self.vec_vars.add(s.var.name)
        self.vec[v] = DType.I64
        lanes: dict[str, tuple[str, ir.Var]] = {}
        for op, var in s.reductions:
            name = self.fresh("lanes")
            ident = fold_identity(op, var.dtype)
            body.emit(
                f"{name} = tl.full([{width}], {_ident_text(ident, var.dtype)}, {self.tl_type(var.dtype)})"
            )
            lanes[name] = (op, var)
            self.lane_vars_of_loop[var.name] = name
            self.vec[name] = var.dtype
        self.stmts(s.body, body)
        for name, (op, var) in lanes.items():
            del self.lane_vars_of_loop[var.name]
            total = self.var_name(var)
            folded = _REDUCE[op].format(x=name)
            body.emit(f"{total} = {_COMBINE[op].format(a=total, b=folded)}.to({self.tl_type(var.dtype)})")
        self.vec_vars = saved_vars
        self.lane_shape = saved
        block.extend(body)

    def lane_bytes(self) -> int:
        total = 0
        for dtype in self.vec.values():
            size = dtype.itemsize
            if dtype is DType.F64 and self.owner.narrow_f64:
                size = 4
            total += size
        return total


def _as_expr(value: int | Expr) -> Expr:
    return ir.index(value)


def _chunk_of(s: ir.Loop) -> ir.Let | None:
    """The `je = min(jb + B, n)` let that opens a chunked row loop (`for jb < n step B`)."""
    if not s.body or not isinstance(s.body[0], ir.Let):
        return None
    let = s.body[0]
    v = let.value
    if not (isinstance(v, ir.Binary) and v.op == "min" and isinstance(v.a, ir.Binary) and v.a.op == "add"):
        return None
    if v.a.a is not s.var or not (isinstance(v.a.b, ir.Const) and v.a.b.value == s.step):
        return None
    if v.b is not _as_expr(s.stop):
        return None
    return let


def _ident_text(value: float | int, dtype: DType) -> str:
    if dtype.is_float:
        return _float_text(float(value))
    return str(int(value))


class KernelRenderer:
    """Renders one IR kernel as a Triton module (see the module docstring)."""

    def __init__(self, kernel: Kernel, *, persistent: bool = False, narrow_f64: bool = False) -> None:
        self.kernel = kernel
        self.persistent = persistent
        self.narrow_f64 = narrow_f64
        self.vec_memo: dict[tuple[frozenset[str], frozenset[str]], dict[Expr, bool]] = {}
        self.scratch: dict[str, tuple[Buffer, int]] = {}
        self.tables: list[Buffer] = [b for b, _ in kernel.constants]  # in argument order
        self.names: dict[str, str] = {}
        for b in kernel.params:
            self.names[b.name] = f"p_{b.name}"
        for k, b in enumerate(self.tables):
            self.names[b.name] = f"c_{k}"

    def pointer(self, buf: Buffer) -> str:
        if buf.name not in self.names and buf.role == "const":  # a table found while rendering
            self.names[buf.name] = f"c_{len(self.tables)}"
            self.tables.append(buf)
        if buf.name not in self.names:
            raise Unsupported(f"buffer {buf.name} is not a parameter, table or scratch of the kernel")
        return self.names[buf.name]

    def arg_names(self) -> list[str]:
        return [
            *(self.names[b.name] for b in self.kernel.params),
            *(self.names[b.name] for b in self.tables),
            *(self.names[b.name] for b, _ in self.scratch.values()),
        ]

    def units(self) -> list[tuple[Stmt, ...]]:
        """Top-level statements grouped into launches: lets/stores ride with the next loop."""
        units: list[tuple[Stmt, ...]] = []
        pending: list[Stmt] = []
        for s in self.kernel.body:
            pending.append(s)
            if isinstance(s, ir.Loop):
                units.append(tuple(pending))
                pending = []
        if pending:
            units.append(tuple(pending))
        return units

    def render(self) -> RenderedKernel:
        functions: list[tuple[str, FunctionRenderer, Block, str, int]] = []
        for k, unit in enumerate(self.units()):
            fn = FunctionRenderer(self, f"{self.kernel.name}_{k}")
            for s in unit:
                if isinstance(s, ir.Loop):
                    for b in s.scratch:
                        self.scratch.setdefault(b.name, (b, _extent(s)))
                        self.names.setdefault(b.name, f"s_{b.name}")
            body = Block(indent=2 if self.persistent else 1)
            kind, extent = self.unit(fn, unit, body)
            functions.append((fn.name, fn, body, kind, extent))
        args = self.arg_names()
        lines = [PRELUDE]
        launches = []
        for name, fn, body, kind, extent in functions:
            consts = ["BLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"] if fn.uses_rblock else [])
            lines.append("\n@triton.jit")
            lines.append(f"def {name}({', '.join([*args, 'NBLOCKS', 'NPROG', *consts])}):")
            lines.append("    pid = tl.program_id(0).to(tl.int64)")
            if self.persistent:
                lines.append("    for bid in range(pid, NBLOCKS, NPROG):")
            else:
                lines.append("    bid = pid")
            lines.extend(body.lines or ["    pass"])
            launches.append(
                Launch(name, kind, extent, tuple(args), fn.lane_bytes(), fn.uses_rblock, fn.row_length)
            )
        header = "# " + (self.kernel.description or self.kernel.name).replace("\n", "\n# ")
        return RenderedKernel(
            self.kernel.name,
            header + "\n" + "\n".join(lines) + "\n",
            tuple(launches),
            self.kernel.params,
            tuple(self.kernel.constants),
            tuple(self.scratch.values()),
        )

    def unit(self, fn: FunctionRenderer, unit: tuple[Stmt, ...], body: Block) -> tuple[str, int]:
        loop = unit[-1] if isinstance(unit[-1], ir.Loop) else None
        head = unit[:-1] if loop is not None else unit
        if loop is None:  # statements outside any loop: one program
            body.emit("if bid == 0:")
            inner = body.child()
            inner.emit("pass")
            fn.stmts(head, inner)
            body.extend(inner)
            return "scalar", 1
        flat = _flat_shape(loop, head)
        if flat is not None:
            self.flat(fn, loop, head, body, *flat)
            return "flat", flat[0]
        if head:
            raise Unsupported("statements before a row loop")
        if not (isinstance(loop.stop, int) and loop.start == 0 and loop.step == 1):
            raise Unsupported("a row loop with a non-constant or offset range")
        fn.lane_shape = "[RBLOCK]"
        body.emit(f"{fn.var_name(loop.var)} = bid")
        for b in loop.scratch:
            fn.bases[b.name] = f"bid * {b.size}"
        fn.stmts(loop.body, body)
        return "row", int(loop.stop)

    def flat(self, fn: FunctionRenderer, loop: ir.Loop, head: tuple[Stmt, ...], body: Block,
             total: int, inner: int) -> None:  # fmt: skip
        lanes = "f"
        body.emit(f"{lanes} = bid * BLOCK + tl.arange(0, BLOCK)")
        body.mask = f"{lanes} < {total}"
        fn.vec["f"] = DType.I64
        if loop.vector:  # one long vector loop (with lets before it)
            row = loop
            outer_var = None
        else:
            row = next(s for s in loop.body if isinstance(s, ir.Loop))
            outer_var = loop.var
        if outer_var is not None:
            body.emit(f"{fn.var_name(outer_var)} = {lanes} // {inner}")
            fn.vec_vars.add(outer_var.name)
        body.emit(f"{fn.var_name(row.var)} = {lanes} % {inner}" if outer_var is not None else
                  f"{fn.var_name(row.var)} = {lanes}")  # fmt: skip
        fn.vec_vars.add(row.var.name)
        fn.stmts(head, body)
        if outer_var is not None:
            fn.stmts(tuple(s for s in loop.body if s is not row), body)
        fn.stmts(row.body, body)


def _extent(loop: ir.Loop) -> int:
    return int(loop.stop) if isinstance(loop.stop, int) else 1


def _flat_shape(loop: ir.Loop, head: tuple[Stmt, ...]) -> tuple[int, int] | None:
    """(points, inner extent) when `loop` (after `head`) is a pointwise nest that flattens."""
    if not isinstance(loop.stop, int) or loop.start != 0 or loop.step != 1 or loop.scratch:
        return None
    if loop.vector and not loop.reductions:
        if any(isinstance(s, ir.Loop) for s in loop.body):
            return None
        return int(loop.stop), int(loop.stop)
    if head:
        return None
    inner = [s for s in loop.body if isinstance(s, ir.Loop)]
    if (
        len(inner) != 1
        or loop.body[-1] is not inner[0]
        or not all(isinstance(s, ir.Let) for s in loop.body[:-1])
    ):
        return None
    row = inner[0]
    if not (row.vector and not row.reductions and not row.scratch and isinstance(row.stop, int)):
        return None
    if row.start != 0 or row.step != 1 or any(isinstance(s, ir.Loop) for s in row.body):
        return None
    return int(loop.stop) * int(row.stop), int(row.stop)


def render_kernel(kernel: Kernel, *, persistent: bool = False, narrow_f64: bool = False) -> RenderedKernel:
    """The Triton module of one IR kernel."""
    return KernelRenderer(kernel, persistent=persistent, narrow_f64=narrow_f64).render()
