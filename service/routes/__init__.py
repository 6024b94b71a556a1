"""One router per resource."""

from __future__ import annotations

from . import artifacts, catalog, fuse, health, jobs

routers = [fuse.router, jobs.router, artifacts.router, catalog.router, health.router]
