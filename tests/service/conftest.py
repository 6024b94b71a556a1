"""Fixtures shared by the service tests; they live in harness.py so the worker tests share them."""

from __future__ import annotations

from harness import embedded_api, redis_db, redis_server

__all__ = ["embedded_api", "redis_db", "redis_server"]
