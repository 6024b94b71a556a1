"""The fusion service: a FastAPI app over a job store, a blob store and Celery workers.

    from autofusion_service import create_app, Settings
    app = create_app(Settings(data_dir="/var/lib/autofusion"))

`autofusion serve` runs it (embedded mode: plus a worker, all on local files). The app factory
loads lazily so that workers, which import only settings and stores from here, stay light.
"""

from __future__ import annotations

from typing import Any

from autofusion_core.settings import Settings

__all__ = ["Settings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .main import create_app

        return create_app
    raise AttributeError(f"module 'autofusion_service' has no attribute {name!r}")
