"""The fusion service: a FastAPI app over a job store, a blob store and Celery workers.

    from autofusion_service import create_app, Settings
    app = create_app(Settings(data_dir="/var/lib/autofusion"))

`autofusion serve` runs it (embedded mode: plus a worker, all on local files).
"""

from __future__ import annotations

from .main import create_app
from .settings import Settings

__all__ = ["Settings", "create_app"]
