# syntax=docker/dockerfile:1.7
#
# The `ascend910` worker image: CANN's base image plus torch-npu and triton-ascend (docs/deploy.md,
# "The Ascend host recipe"). Built from the repository root:
#
#   docker build -f deploy/docker/ascend910.Dockerfile -t graph-autofusion-worker-ascend910 .
#
# Versions (pinned; change them together):
#   CANN         8.5.0      the base image below; the NPU driver and firmware stay on the host
#   Python       3.11       the base image's
#   torch        2.13.0     pyproject.toml, extra `ascend910`
#   torch-npu    2.13.0     requires torch 2.13.0
#   triton-ascend 3.2.0     provides the `triton` package (it replaces upstream triton)
# torch-npu's README maps its releases to CANN versions; its table stops at torch 2.12 for CANN
# 8.5.0. Check 2.13.0 against the CANN you run before you roll this image out, and move
# CANN_IMAGE and the extra together. The image is not built in CI (no CANN there); the worker's
# start-up check (`autofusion worker --targets ascend910`, exit status 3 with one line when CANN,
# torch_npu, triton-ascend or an NPU is missing) is what says an image or host is wrong.
#
# The install step is the project's own (`./run install --no-dev --extra ascend910`), as in the
# main Dockerfile; only the base differs, which is why this is a file of its own.

ARG CANN_IMAGE=ascendai/cann:8.5.0-910b-ubuntu22.04-py3.11

FROM ${CANN_IMAGE} AS build
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHON=python3.11
WORKDIR /app
COPY pyproject.toml setup.py README.md run ./
COPY clients/python/ clients/python/
COPY graph_autofusion/ graph_autofusion/
COPY core/ core/
COPY service/ service/
COPY worker/ worker/
RUN ./run install --no-dev --extra ascend910 \
    && .venv/bin/python -m compileall -q graph_autofusion core service worker
COPY deploy/docker/healthcheck.py deploy/docker/healthcheck.py

FROM ${CANN_IMAGE} AS worker-ascend910
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE_URL=
LABEL org.opencontainers.image.title="graph-autofusion-worker-ascend910" \
      org.opencontainers.image.description="Operator-fusion compiler for ONNX models: Ascend 910 worker" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE_URL}"
# gcc: the `cpu` fallback path of host ops and Triton's launcher stubs; tini: signals and reaping.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 autofusion \
    && useradd --system --uid 10001 --gid autofusion --home-dir /home/autofusion --create-home \
       --shell /usr/sbin/nologin autofusion \
    && mkdir -p /data \
    && chown autofusion:autofusion /data
COPY --from=build /app /app
# CANN's environment (what its set_env.sh exports) must reach the worker: the entry point sources
# it when it is there, then runs autofusion, whose start-up check says what is missing otherwise.
# TRITON_HOME and CANN's logs (ASCEND_PROCESS_LOG_PATH, else under $HOME): scratch under /tmp, since
# the pods' root file system is read-only.
ENV PATH=/app/.venv/bin:$PATH \
    AUTOFUSION_DATA_DIR=/data \
    TRITON_HOME=/tmp/triton \
    ASCEND_PROCESS_LOG_PATH=/tmp/ascend/log
VOLUME ["/data"]
USER autofusion
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["python", "/app/deploy/docker/healthcheck.py", "worker"]
ENTRYPOINT ["tini", "--", "bash", "-c", "f=/usr/local/Ascend/ascend-toolkit/set_env.sh; if [ -f $f ]; then source $f; fi; exec autofusion \"$@\"", "autofusion"]
CMD ["worker", "--targets", "ascend910"]
