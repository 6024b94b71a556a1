# syntax=docker/dockerfile:1.7
#
# Three images from one file (see docs/deploy.md):
#   docker build --target api         -t graph-autofusion-api .          # FastAPI service: no compiler, no BLAS
#   docker build --target worker      -t graph-autofusion-worker .       # Celery worker: gcc + OpenBLAS for `cpu`
#   docker build --target worker-cuda -t graph-autofusion-worker-cuda .  # + torch (CUDA build), triton: `cuda`
# The Ascend worker needs CANN's base image: deploy/docker/ascend910.Dockerfile.
#
# Dependencies are installed by `./run install`, the same step CI runs (.ci/run), from the pinned
# pyproject.toml; `--no-dev` leaves out the test and lint tools, `--extra cuda` adds the GPU worker's
# torch and triton. Nothing secret is baked in: API keys and the Redis URL come from the environment
# at run time.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- base: what every stage shares ------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /app

# ---- build: the virtual environment, by the shared install step ----------------------------------
FROM base AS build
COPY pyproject.toml setup.py README.md run ./
COPY clients/python/ clients/python/
COPY graph_autofusion/ graph_autofusion/
COPY core/ core/
COPY service/ service/
COPY worker/ worker/
RUN ./run install --no-dev \
    && .venv/bin/python -m compileall -q graph_autofusion core service worker
COPY deploy/docker/healthcheck.py deploy/docker/healthcheck.py

# ---- build-cuda: the same environment plus the `cuda` extra (torch's CUDA build, triton) ----------
# torch's Linux wheel carries the CUDA runtime libraries and triton's wheel its ptxas, so no CUDA
# base image is needed: only the driver comes from the host (the NVIDIA Container Toolkit mounts it).
FROM build AS build-cuda
RUN ./run install --no-dev --extra cuda \
    && .venv/bin/python -m compileall -q graph_autofusion core service worker

# ---- build-api: the same environment without the BLAS only the worker's kernels link against -----
FROM build AS build-api
RUN .venv/bin/pip uninstall -y -q scipy-openblas32

# ---- runtime: a non-root user, tini as PID 1 (signals reach the service, children are reaped) ----
FROM base AS runtime
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE_URL=
LABEL org.opencontainers.image.title="graph-autofusion" \
      org.opencontainers.image.description="Operator-fusion compiler for ONNX models: API and workers" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 autofusion \
    && useradd --system --uid 10001 --gid autofusion --home-dir /home/autofusion --create-home \
       --shell /usr/sbin/nologin autofusion \
    && mkdir -p /data \
    && chown autofusion:autofusion /data
# /data is the volume shared by the API and the workers: blobs, and the kernel cache under it.
ENV PATH=/app/.venv/bin:$PATH \
    AUTOFUSION_DATA_DIR=/data
VOLUME ["/data"]
ENTRYPOINT ["tini", "--", "autofusion"]

# ---- worker-base: the runtime plus a C compiler (the `cpu` kernels; Triton's launcher stubs) ------
FROM runtime AS worker-base
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

# ---- worker-cuda: serves `fuse.cuda`; Triton kernels, cubins, verification on the GPU -------------
# `docker run --gpus 1 …` (Compose profile `gpu`, deploy/k8s/worker-cuda.yaml). It refuses to start,
# exit status 3 and one line saying what is missing, on a host whose GPU it cannot see.
FROM worker-base AS worker-cuda
COPY --from=build-cuda /app /app
# Triton's scratch files under /tmp (the Kubernetes pods' root file system is read-only); its binary
# cache goes beside the kernel cache on the shared volume (the worker sets TRITON_CACHE_DIR).
ENV TRITON_HOME=/tmp/triton \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER autofusion
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["python", "/app/deploy/docker/healthcheck.py", "worker"]
CMD ["worker", "--targets", "cuda"]

# ---- worker: serves the `fuse.cpu` queue; compiles C kernels with gcc against OpenBLAS ------------
FROM worker-base AS worker
COPY --from=build /app /app
USER autofusion
# Celery's warm shutdown on SIGTERM: finish the running job (or hand its message back), then exit.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["python", "/app/deploy/docker/healthcheck.py", "worker"]
CMD ["worker", "--targets", "cpu"]

# ---- api: the HTTP service on port 8000 (the default target of `docker build .`) ----------------
FROM runtime AS api
COPY --from=build-api /app /app
USER autofusion
EXPOSE 8000
# uvicorn drains in-flight requests on SIGTERM before it exits.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "/app/deploy/docker/healthcheck.py", "http", "/healthz"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
