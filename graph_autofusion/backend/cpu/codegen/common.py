"""The C-text bridge for generators that still write C themselves (reductions, pooling, ArgMax,
CumSum): a tensor's value at an index as a C expression, computed through the kernel IR.

A generator asks for the value of a tensor at a symbolic multi-index
(`KernelEmitter.value(block, tensor, idx)`, indices as C strings or ints). A tensor produced inside
the kernel is built as an IR expression by its op's index rule (graph_autofusion.lower.values:
the registry's formula for elementwise ops, an index map for injective ones) and rendered by the C
renderer into the block; the few ops whose code is still C text here (pooling windows,
arg-reductions, the row template's shifted exp) keep a *node rule* in this package. Each distinct
(tensor, index) pair becomes one `const` local, so a value used twice is computed once; values
computed inside a guarded branch (Concat, constant Pad) live in a child block whose locals die
with the branch, so no out-of-range read is ever hoisted out of the branch that guards it.

New kernels are lowered to IR whole (graph_autofusion.lower) and rendered by render_c; this bridge
shrinks as the remaining templates move there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx

from ....kernel_ir import DType, Expr, TensorAt
from ....kernel_ir import nodes as ir
from ....lower.pointwise import PARALLEL_MIN_ELEMENTS
from ....lower.values import IndexGroup as IRIndexGroup
from ....lower.values import Unsupported, Values, attrs_of, normalize_axis
from .. import render_c
from ..kernel_spec import KernelSpec, TensorInfo
from ..render_c import PRELUDE, Block, ExprRenderer, prelude, vector_math_functions

__all__ = [
    "PARALLEL_MIN_ELEMENTS",
    "PRELUDE",
    "Block",
    "CodegenUnsupported",
    "Index",
    "IndexGroup",
    "KernelEmitter",
    "attrs_of",
    "c_literal",
    "node_rule",
    "normalize_axis",
    "numel",
    "prelude",
    "reshape_index",
    "vector_math_functions",
]

Index = list[str | int]
NodeRule = Callable[["KernelEmitter", Block, onnx.NodeProto, int, Index], str]
CodegenUnsupported = Unsupported  # one exception for "this kernel cannot be generated"

_NODE_RULES: dict[str, NodeRule] = {}


def node_rule(*op_types: str) -> Callable[[NodeRule], NodeRule]:
    """Register how a kernel-internal op that has no IR index rule computes its output in C."""

    def register(fn: NodeRule) -> NodeRule:
        for op in op_types:
            _NODE_RULES[op] = fn
        return fn

    return register


def c_literal(value: object, elem_type: int) -> str:
    """A C literal of an ONNX element type (INFINITY/NAN spelled out)."""
    return render_c.c_literal(value, DType.from_onnx(elem_type))


def numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


class IndexGroup:
    """Loop variables `names` (C names) that decompose the linear index `expr` over `dims`."""

    def __init__(self, names: tuple[str, ...], dims: tuple[int, ...], expr: str) -> None:
        self.names, self.dims, self.expr = names, dims, expr

    def to_ir(self) -> IRIndexGroup:
        return IRIndexGroup(tuple(_index_expr(n) for n in self.names), self.dims, _index_expr(self.expr))


def _index_expr(e: str | int | Expr) -> Expr:
    if isinstance(e, Expr):
        return e
    return ir.index(e) if isinstance(e, int) else ir.raw(e, DType.I64)


class KernelEmitter:
    """Generation state for one C-text kernel: parameters, constants, locals and node rules."""

    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        self.tensors: dict[str, TensorInfo] = dict(spec.tensors)
        self.constants: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in spec.constants.items()}
        self.values = Values(self.tensors, self.constants)  # shares both dicts
        self.producer: dict[str, tuple[onnx.NodeProto, int]] = {}
        for node in spec.nodes:
            for k, out in enumerate(node.output):
                if out:
                    self.producer[out] = (node, k)
        self.inputs: dict[str, str] = {}
        for k, t in enumerate(spec.inputs):
            self.inputs.setdefault(t.name, f"in{k}")
        self.outputs: dict[str, str] = {t.name: f"out{k}" for k, t in enumerate(spec.outputs)}
        self.const_arrays: dict[str, str] = {}
        self.const_decls: list[str] = []
        self.overrides: dict[str, str] = {}  # tensor -> C expression valid at the current point
        self.groups: list[IndexGroup] = []
        self.hooks: list[Callable[[str, Block], str | None]] = []  # consulted before node rules
        self.exprs = ExprRenderer(resolve=self._resolve)

    # -- names -------------------------------------------------------------------------------
    def fresh(self, prefix: str = "t") -> str:
        return self.exprs.fresh(prefix)

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise CodegenUnsupported(f"no shape known for tensor {name!r}") from None

    def add_tensor(self, name: str, shape: Sequence[int], elem_type: int) -> str:
        self.tensors[name] = TensorInfo(name, tuple(int(d) for d in shape), elem_type)
        return name

    def constant(self, name: str) -> np.ndarray | None:
        return self.constants.get(name)

    # -- addressing --------------------------------------------------------------------------
    def lin(self, idx: Index, shape: Sequence[int]) -> str | int:
        """Row-major linear offset of `idx` in `shape`, using declared index groups."""
        self.values.groups = [g.to_ir() for g in self.groups]
        return self._text(self.values.lin([_index_expr(e) for e in idx], shape), None)

    def declare(self, block: Block, ctype: str, expr: str, prefix: str = "t") -> str:
        name = self.fresh(prefix)
        block.emit(f"const {ctype} {name} = {expr};")
        return name

    def _text(self, e: Expr, block: Block | None) -> str | int:
        """An index expression as C (an int when it is a constant)."""
        if isinstance(e, ir.Const):
            return int(e.value)
        return self.exprs(e, block if block is not None else Block(indent=0))

    # -- values ------------------------------------------------------------------------------
    def value(self, block: Block, name: str, idx: Index) -> str:
        """A C expression for tensor `name` at multi-index `idx` (in the tensor's own shape)."""
        if name in self.overrides:
            return self.overrides[name]
        for hook in self.hooks:
            found = hook(name, block)
            if found is not None:
                return found
        info = self.info(name)
        const = self.constants.get(name)
        if const is not None and const.size == 1:
            return c_literal(const.reshape(-1)[0], info.elem_type)
        if name in self.inputs and name not in self.producer:
            return f"{self.inputs[name]}[{self.lin(idx, info.shape)}]"
        if const is not None:
            return f"{self.const_array(name)}[{self.lin(idx, info.shape)}]"
        key = (name, tuple(idx))
        found = block.lookup(key)
        if found is not None:
            return found
        if name not in self.producer:
            raise CodegenUnsupported(f"tensor {name!r} is neither an input, a constant nor computed here")
        node, k = self.producer[name]
        rule = _NODE_RULES.get(node.op_type)
        if rule is not None:
            expr = rule(self, block, node, k, idx)
        else:
            self.values.groups = [g.to_ir() for g in self.groups]
            expr = self.exprs(self.values.produce(node, k, [_index_expr(e) for e in idx]), block)
        if _is_atom(expr):
            block.memo[key] = expr
            return expr
        var = self.declare(block, info.ctype, expr)
        block.memo[key] = var
        return var

    def _resolve(self, at: TensorAt, block: Block) -> str:
        """The C renderer meets a tensor read: this emitter computes it (inputs, rules, hooks)."""
        return self.value(block, at.tensor, [self._text(e, block) for e in at.index])

    def const_array(self, name: str) -> str:
        if name not in self.const_arrays:
            info = self.info(name)
            values = self.constants[name].reshape(-1)
            cname = f"{self.spec.symbol}_c{len(self.const_arrays)}"
            body = ", ".join(c_literal(v, info.elem_type) for v in values)
            self.const_decls.append(f"static const {info.ctype} {cname}[{values.size}] = {{{body}}};")
            self.const_arrays[name] = cname
        return self.const_arrays[name]

    def const_ints(self, name: str, what: str) -> list[int]:
        """The values of an integer input that must be known at compile time (shape, axes)."""
        return self.values.const_ints(name, what)

    # -- the function frame --------------------------------------------------------------------
    def signature_lines(self) -> list[str]:
        """Pointer declarations for every parameter, in call order."""
        lines = []
        for k, t in enumerate(self.spec.inputs):
            lines.append(f"  const {t.ctype} *restrict in{k} = (const {t.ctype} *)args[{k}];")
        base = len(self.spec.inputs)
        for k, t in enumerate(self.spec.outputs):
            lines.append(f"  {t.ctype} *restrict out{k} = ({t.ctype} *)args[{base + k}];")
        return lines

    def assemble(self, description: str, body: list[str]) -> str:
        comment = self.spec.describe(description).replace("*/", "* /").replace("/*", "/ *")
        parts = [prelude(), *self.const_decls, "", "/* " + comment.replace("\n", "\n * ") + "\n */"]
        parts.append(f"void {self.spec.symbol}(void *const *args) {{")
        parts.extend(self.signature_lines())
        parts.extend(body)
        parts.append("}")
        return "\n".join(parts) + "\n"


def _is_atom(expr: str) -> bool:
    return expr.replace("_", "").isalnum() or expr.startswith(("INT64_C", "(-INT64_C"))


def reshape_index(
    em: KernelEmitter, block: Block, idx: Index, out_shape: Sequence[int], in_shape: Sequence[int]
) -> Index:
    """Map an index of a reshaped tensor back to its source (lower.values.Values.reshape_index)."""
    em.values.groups = [g.to_ir() for g in em.groups]
    mapped = em.values.reshape_index([_index_expr(e) for e in idx], out_shape, in_shape)
    return [em._text(e, block) for e in mapped]
