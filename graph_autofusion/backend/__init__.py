"""Backends that compile a fused ONNX model into something that runs."""
