# syntax=docker/dockerfile:1
# The worker for NVIDIA GPUs (the node needs the NVIDIA driver and container
# toolkit; Kubernetes, the NVIDIA device plugin). Build from the repository root:
#   docker build -f deploy/docker/worker-cuda.Dockerfile -t sie-worker-cuda:0.1.0 .
# pip's settings (a mirror): the build secret pip.conf, as in deploy/docker/Dockerfile.

FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first and pinned: the Linux wheel on PyPI is the CUDA build (its CUDA
# libraries come as nvidia-* wheels), so installing the worker never pulls another.
ARG TORCH=torch==2.13.0
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    pip install "${TORCH}"
WORKDIR /opt/sie
COPY contract/python contract/python
COPY lib lib
COPY services/worker services/worker
COPY bundles bundles
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    pip install ./contract/python ./lib ./services/worker dumb-init==1.2.5.post1 \
 && groupadd --system --gid 10001 sie \
 && useradd --system --uid 10001 --gid sie --home-dir /var/lib/sie --create-home sie
USER 10001
# Every address of the container: it needs SIE_WORKER_TOKEN to start (deploy/docker/Dockerfile, worker-cpu).
ENV SIE_BUNDLES_DIR=/opt/sie/bundles SIE_DEVICE=cuda SIE_HOST=0.0.0.0
EXPOSE 50061 9095
# dumb-init as PID 1 passes SIGTERM on to the worker even before it has set its handler (deploy/docker/Dockerfile, INIT).
ENTRYPOINT ["dumb-init", "--single-child", "--", "sie-worker"]
CMD ["serve"]
