# Runtime image for every Pyrsia service (docker-compose.yml).
#   docker build -t pyrsia .                                   CPU torch (default)
#   docker build -t pyrsia:cuda --build-arg TORCH_INDEX_URL= \
#       --build-arg BASE_IMAGE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04 .   CUDA torch
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# PyTorch's CPU-only wheel index keeps the image small; empty it for the default (CUDA) wheels.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PERSIA_BIND_HOST=0.0.0.0
RUN if ! command -v python3 >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends python3 python3-pip \
        && rm -rf /var/lib/apt/lists/*; \
    fi

WORKDIR /opt/pyrsia
COPY pyproject.toml README.md ./
COPY persia ./persia
COPY pyrsia ./pyrsia
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
        pip install "torch==${TORCH_VERSION}" --index-url "$TORCH_INDEX_URL"; \
    else \
        pip install "torch==${TORCH_VERSION}"; \
    fi \
    && pip install .

WORKDIR /workspace
ENTRYPOINT ["persia-launcher"]
