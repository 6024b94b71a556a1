"""Client SDK for the graph-autofusion service.

Depends on httpx and pydantic only, so a deployment pipeline can submit models for fusion, wait for
them, and fetch the fused model without installing the compiler::

    from graph_autofusion_client import Client

    with Client("http://fusion.internal:8000", api_key="...") as client:
        job = client.fuse("model.onnx", "fused.onnx", config={"max_fusion_size": 32})
        print(job.id, job.report().kernels.after)

Everything public is importable from here; the underscored modules are private.
"""

from ._client import AsyncClient, Client
from ._config import FusionConfig
from ._exceptions import (
    AuthenticationError,
    AutofusionError,
    IntegrityError,
    InvalidConfigError,
    InvalidModelError,
    InvalidRequestError,
    JobCancelledError,
    JobFailedError,
    JobNotReadyError,
    NotFoundError,
    PayloadTooLargeError,
    ServiceUnavailableError,
    UnexpectedResponseError,
    UnknownTargetError,
    WaitTimeoutError,
)
from ._job import AsyncJob, Job
from ._models import (
    ArtifactRef,
    Artifacts,
    BeforeAfter,
    Estimates,
    FusedGroup,
    JobPage,
    JobState,
    JobStatus,
    Links,
    ModelInfo,
    Objective,
    OperatorCounts,
    PatternInfo,
    PatternStats,
    Problem,
    Progress,
    RefusedCandidate,
    Report,
    Target,
)
from ._retry import RetryPolicy
from ._version import __version__

__all__ = [
    "ArtifactRef",
    "Artifacts",
    "AsyncClient",
    "AsyncJob",
    "AuthenticationError",
    "AutofusionError",
    "BeforeAfter",
    "Client",
    "Estimates",
    "FusedGroup",
    "FusionConfig",
    "IntegrityError",
    "InvalidConfigError",
    "InvalidModelError",
    "InvalidRequestError",
    "Job",
    "JobCancelledError",
    "JobFailedError",
    "JobNotReadyError",
    "JobPage",
    "JobState",
    "JobStatus",
    "Links",
    "ModelInfo",
    "NotFoundError",
    "Objective",
    "OperatorCounts",
    "PatternInfo",
    "PatternStats",
    "PayloadTooLargeError",
    "Problem",
    "Progress",
    "RefusedCandidate",
    "Report",
    "RetryPolicy",
    "ServiceUnavailableError",
    "Target",
    "UnexpectedResponseError",
    "UnknownTargetError",
    "WaitTimeoutError",
    "__version__",
]
