"""`POST /fuse` bodies parsed as they stream in: the model goes straight into the blob store.

Form handling before a route runs would spool the upload to a temporary file (a thread hop per
chunk), and the route would then read it again to hash it and once more to store it: three passes
over a 100 MB model. Here the multipart stream is parsed chunk by chunk (python-multipart's parser);
the `model` part is hashed and written to a staged blob as it arrives, so that it is on disk and
named by its digest when the last byte is in. Text fields are small and kept in memory, bounded.
A body without a file (`model_digest` instead of `model`) may also come url-encoded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.exceptions import HTTPException
from starlette.requests import Request

from autofusion_core.blobs import BlobStore, StagedBlob

from .problems import ProblemError

#: The form fields of a submission (anything else is ignored).
TEXT_FIELDS: frozenset[str] = frozenset({"config", "target", "model_digest", "model_filename"})
#: Largest accepted text field: a config with declarative patterns is a few KiB.
MAX_FIELD_BYTES = 1 << 20
MULTIPART = "multipart/form-data"
URLENCODED = "application/x-www-form-urlencoded"

_MODEL_SCHEMA: dict[str, Any] = {
    "type": "string",
    "format": "binary",
    "description": "The ONNX model file. Required unless `model_digest` is given.",
}
_TEXT_SCHEMAS: dict[str, Any] = {
    "model_digest": {
        "type": "string",
        "pattern": "^[0-9a-f]{64}$",
        "description": "Instead of `model`: the sha256 (hex) of a model this tenant uploaded before, "
        "so that a resubmission sends no model bytes. A digest the tenant has not uploaded (another "
        "tenant's upload does not count) is refused with `422 unknown_model_digest`; send the file "
        "then. With `model` too, it must match the file.",
    },
    "model_filename": {
        "type": "string",
        "maxLength": 255,
        "description": "The model's file name, with `model_digest` (default `model.onnx`).",
    },
    "config": {"type": "string", "description": "The engine's FusionConfig as a JSON object."},
    "target": {"type": "string", "default": "cpu", "description": "Target to compile for, e.g. `cpu`."},
}
#: The request body as OpenAPI describes it (the route reads the stream itself, so FastAPI cannot).
REQUEST_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        MULTIPART: {
            "schema": {
                "title": "FuseForm",
                "type": "object",
                "properties": {"model": _MODEL_SCHEMA, **_TEXT_SCHEMAS},
            }
        },
        URLENCODED: {
            "schema": {
                "title": "FuseDigestForm",
                "type": "object",
                "required": ["model_digest"],
                "properties": _TEXT_SCHEMAS,
            }
        },
    },
}


@dataclass
class Submission:
    """The parsed form: text fields, and the model part (staged in the blob store) if one came."""

    fields: dict[str, str] = field(default_factory=dict)
    model: StagedBlob | None = None
    model_filename: str | None = None

    def discard(self) -> None:
        if self.model is not None:
            self.model.discard()


def _invalid(detail: str, loc: str = "body") -> ProblemError:
    errors = [{"loc": ["body", loc] if loc != "body" else ["body"], "msg": detail, "type": "value_error"}]
    return ProblemError("validation_error", 422, detail, title="Invalid request", errors=errors)


def _too_large(limit: int) -> ProblemError:
    return ProblemError(
        "payload_too_large", 413, f"the model exceeds the limit of {limit} bytes", limit_bytes=limit
    )


class _PartCollector:
    """python-multipart callbacks: route each part's bytes to the staged model or a text buffer."""

    def __init__(self, blobs: BlobStore, max_model_bytes: int, submission: Submission) -> None:
        self.blobs, self.max_model_bytes, self.submission = blobs, max_model_bytes, submission
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._headers: dict[bytes, bytes] = {}
        self._field: str | None = None
        self._text = bytearray()
        self._to_model = False
        self.ended = False

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda data, start, end: self._header_name.extend(data[start:end]),
            "on_header_value": lambda data, start, end: self._header_value.extend(data[start:end]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
            "on_end": self._end,
        }

    def _part_begin(self) -> None:
        self._headers, self._field, self._to_model = {}, None, False
        self._text.clear()

    def _header_end(self) -> None:
        self._headers[bytes(self._header_name).lower()] = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        if name == "model":
            if self.submission.model is not None:
                raise _invalid("more than one `model` part", "model")
            self.submission.model = self.blobs.stage()
            filename = options.get(b"filename")
            if filename:
                self.submission.model_filename = filename.decode("utf-8", "replace")
            self._to_model = True
        elif name in TEXT_FIELDS:
            self._field = name

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._to_model:
            model = self.submission.model
            assert model is not None
            if model.size + (end - start) > self.max_model_bytes:
                raise _too_large(self.max_model_bytes)
            model.write(memoryview(data)[start:end])
        elif self._field is not None:
            if len(self._text) + (end - start) > MAX_FIELD_BYTES:
                raise _invalid(f"field `{self._field}` is over {MAX_FIELD_BYTES} bytes", self._field)
            self._text.extend(data[start:end])

    def _part_end(self) -> None:
        if self._to_model and self.submission.model is not None:
            self.submission.model.close()
        elif self._field is not None:
            try:
                self.submission.fields[self._field] = self._text.decode()
            except UnicodeDecodeError:
                raise _invalid(f"field `{self._field}` is not UTF-8 text", self._field) from None
        self._field, self._to_model = None, False

    def _end(self) -> None:
        self.ended = True


async def read_submission(request: Request, blobs: BlobStore, max_model_bytes: int) -> Submission:
    """Parse the body of `POST /fuse`. On any error the staged model is removed and a problem raised
    (422 `validation_error` for a malformed body, 413 `payload_too_large` for a model over the limit)."""
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    media_type = content_type.decode("latin-1").lower()
    submission = Submission()
    try:
        if media_type == MULTIPART:
            boundary = options.get(b"boundary")
            if not boundary:
                raise _invalid("multipart/form-data without a boundary")
            collector = _PartCollector(blobs, max_model_bytes, submission)
            parser = MultipartParser(boundary, collector.callbacks())
            try:
                async for chunk in request.stream():
                    if chunk:
                        parser.write(chunk)
                parser.finalize()
            except MultipartParseError as exc:
                raise _invalid(f"malformed multipart body: {exc}") from None
            if not collector.ended:
                raise _invalid("the multipart body ends early")
        elif media_type == URLENCODED:
            try:
                form = await request.form(max_files=0, max_fields=len(TEXT_FIELDS) + 8)
            except HTTPException as exc:
                # Starlette answers a form over its field limit with a bare 400; to a client it is one
                # more malformed body, so it gets the same stable code as the rest.
                raise _invalid(f"malformed form body: {exc.detail}") from None
            for name in TEXT_FIELDS:
                value = form.get(name)
                if isinstance(value, str):
                    submission.fields[name] = value
        else:
            raise _invalid(f"the body must be {MULTIPART} (or {URLENCODED} with `model_digest`)")
    except BaseException:
        submission.discard()
        raise
    return submission
