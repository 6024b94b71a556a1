import io
from pathlib import Path

import pytest
from graph_autofusion_client._inputs import model_upload


class FakeProto:
    def SerializeToString(self) -> bytes:
        return b"proto-bytes"


def _read(upload) -> bytes:
    _, handle, _ = upload.multipart()["model"]
    with handle:
        return handle.read()


def test_every_kind_of_model_replays_the_same_bytes(tmp_path: Path) -> None:
    path = tmp_path / "net.onnx"
    path.write_bytes(b"file-bytes")
    stream = io.BytesIO(b"xxstream-bytes")
    stream.seek(2)
    cases = {
        "path": (model_upload(path), "net.onnx", b"file-bytes"),
        "str": (model_upload(str(path)), "net.onnx", b"file-bytes"),
        "bytes": (model_upload(b"raw"), "model.onnx", b"raw"),
        "proto": (model_upload(FakeProto(), filename="p.onnx"), "p.onnx", b"proto-bytes"),
        "stream": (model_upload(stream), "model.onnx", b"stream-bytes"),
    }
    for label, (upload, filename, data) in cases.items():
        assert upload.filename == filename, label
        assert _read(upload) == data, label
        assert _read(upload) == data, f"{label}: a retry must send the same bytes"
    assert not stream.closed  # the caller's file stays theirs


def test_bad_models_fail_before_any_request(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.onnx"):
        model_upload(tmp_path / "missing.onnx")
    with pytest.raises(TypeError, match="ModelProto"):
        model_upload(42)  # type: ignore[arg-type]
