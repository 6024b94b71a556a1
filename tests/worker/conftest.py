"""The worker tests share the service tests' harness and fixtures."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))

from harness import embedded_api, redis_db, redis_server

__all__ = ["embedded_api", "redis_db", "redis_server"]
