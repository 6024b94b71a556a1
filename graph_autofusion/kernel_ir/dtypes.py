"""Element types of the kernel IR: how a tensor is stored, and in which type it is computed.

Every renderer needs the same two facts about an element type: its storage (what a buffer holds)
and its compute type (what arithmetic runs in). They differ only for the 16-bit floats, which are
stored as 16 bits and computed in fp32, as onnxruntime and the accelerator compilers do; so a
fp16 model's intermediate results keep fp32 precision inside one kernel and round once per store.
"""

from __future__ import annotations

import enum

import numpy as np
import onnx


class DType(enum.Enum):
    """One element type; `value` is the name the IR printer uses."""

    F64 = "f64"
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    I64 = "i64"
    I32 = "i32"
    I16 = "i16"
    I8 = "i8"
    U64 = "u64"
    U32 = "u32"
    U16 = "u16"
    U8 = "u8"
    BOOL = "bool"

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_signed(self) -> bool:
        return self.is_float or self in (DType.I64, DType.I32, DType.I16, DType.I8)

    @property
    def compute(self) -> DType:
        """The type arithmetic on this type runs in (16-bit floats widen to fp32)."""
        return DType.F32 if self in (DType.F16, DType.BF16) else self

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def onnx(self) -> int:
        return _TO_ONNX[self]

    @property
    def numpy(self) -> np.dtype:
        if self is DType.BF16:
            raise ValueError("numpy has no bfloat16; bf16 buffers travel as uint16")
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self.onnx))

    @staticmethod
    def from_onnx(elem_type: int) -> DType:
        try:
            return _FROM_ONNX[elem_type]
        except KeyError:
            name = onnx.TensorProto.DataType.Name(elem_type)
            raise ValueError(f"the kernel IR has no element type for ONNX {name}") from None


_FLOATS = frozenset({DType.F64, DType.F32, DType.F16, DType.BF16})
_ITEMSIZE = {
    DType.F64: 8,
    DType.F32: 4,
    DType.F16: 2,
    DType.BF16: 2,
    DType.I64: 8,
    DType.I32: 4,
    DType.I16: 2,
    DType.I8: 1,
    DType.U64: 8,
    DType.U32: 4,
    DType.U16: 2,
    DType.U8: 1,
    DType.BOOL: 1,
}
_TO_ONNX = {
    DType.F64: onnx.TensorProto.DOUBLE,
    DType.F32: onnx.TensorProto.FLOAT,
    DType.F16: onnx.TensorProto.FLOAT16,
    DType.BF16: onnx.TensorProto.BFLOAT16,
    DType.I64: onnx.TensorProto.INT64,
    DType.I32: onnx.TensorProto.INT32,
    DType.I16: onnx.TensorProto.INT16,
    DType.I8: onnx.TensorProto.INT8,
    DType.U64: onnx.TensorProto.UINT64,
    DType.U32: onnx.TensorProto.UINT32,
    DType.U16: onnx.TensorProto.UINT16,
    DType.U8: onnx.TensorProto.UINT8,
    DType.BOOL: onnx.TensorProto.BOOL,
}
_FROM_ONNX = {v: k for k, v in _TO_ONNX.items()}
