"""What the API and the workers share, owned by neither: settings, the job store, the blob store,
the target registry and the queue contract (task name, queue names, broker options, publishing).

The service (`autofusion_service`, folder `service/`) and the workers (`autofusion_worker`, folder
`worker/`) import this package and never each other: the API enqueues a job by the task's *name*,
so it needs none of the worker's code, and the worker reads jobs through the same store the API
writes, so it needs none of the API's.
"""

from __future__ import annotations

from .settings import Settings

__all__ = ["Settings"]
