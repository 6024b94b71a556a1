"""Errors raised by the engine.

Every error a user can provoke is a `FusionError` with a stable machine-readable `code` and a
sentence a person can act on. The service maps `code` straight into its problem+json answers and
the CLI prints the sentence, so neither needs to know engine internals.

    FusionError
    ├── InvalidModelError        the bytes are not a usable ONNX model (code names why)
    │   ├── ModelTooLargeError   over the configured size or node limits
    │   └── UnboundDimensionError a symbolic input dimension has no value in config.input_shapes
    ├── UnsupportedModelError    valid ONNX the engine will not handle (opset, external data,
    │                            host_op_refused: an op would run on the host, config forbids it)
    ├── InvalidConfigError       a config value or a declarative pattern is wrong
    ├── CompilationError         the C compiler rejected a generated kernel
    ├── RuntimeInputError        inputs given to a compiled model have the wrong name/shape/dtype
    ├── IsaMismatchError         compiled kernels need an instruction set this host lacks
    └── VerificationError        the fused model disagrees with onnxruntime beyond tolerance
"""

from __future__ import annotations

from typing import Any


class FusionError(Exception):
    """Base of every engine error: a stable `code` plus a human sentence."""

    code: str = "fusion_error"
    status: int = 422  # the HTTP status the service answers with

    def __init__(self, message: str, *, code: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable view used by reports, the service and the CLI."""
        return {"code": self.code, "message": self.message, **self.details}

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class InvalidModelError(FusionError):
    code = "invalid_model"


class ModelTooLargeError(InvalidModelError):
    code = "model_too_large"


class UnboundDimensionError(InvalidModelError):
    code = "unbound_dimension"


class UnsupportedModelError(FusionError):
    code = "unsupported_model"


class InvalidConfigError(FusionError):
    code = "invalid_config"


class CompilationError(FusionError):
    code = "compilation_failed"
    status = 500


class RuntimeInputError(FusionError):
    code = "invalid_inputs"


class IsaMismatchError(FusionError):
    """Kernels built for an ISA this host lacks (`isa_mismatch`): calling them would kill the
    process with SIGILL, so they are refused before any of their code runs."""

    code = "isa_mismatch"


class VerificationError(FusionError):
    code = "verification_failed"
    status = 500
