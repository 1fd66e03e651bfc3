# Runtime image for every Pyrsia service (docker-compose.yml).
#   docker build -t pyrsia .                                   CPU torch (default)
#   docker build -t pyrsia:cuda --build-arg TORCH_INDEX_URL= \
#       --build-arg BASE_IMAGE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04 .   CUDA torch
#   make images      no registry: a Debian base made by debootstrap (BASE_IMAGE=pyrsia-base:bookworm)
#                    and every wheel from docker/wheelhouse (scripts/docker/images.sh)
# When docker/wheelhouse holds wheels, pip installs from there only (--no-index); otherwise
# from the package index (torch from TORCH_INDEX_URL).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS runtime
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PERSIA_BIND_HOST=0.0.0.0 VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
RUN if ! python3 -c "import venv, ensurepip" 2>/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi

FROM runtime AS build
# PyTorch's CPU-only wheel index keeps the image small; empty it for the default (CUDA) wheels.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
# the dependencies first, in a layer of their own that survives changes to the code
COPY docker/wheelhouse/ /opt/wheelhouse/
RUN python3 -m venv /opt/venv \
    && if ls /opt/wheelhouse/*.whl >/dev/null 2>&1; then \
        echo "installing offline from docker/wheelhouse" \
        && pip install --no-index --find-links /opt/wheelhouse /opt/wheelhouse/*.whl ; \
    elif [ -n "$TORCH_INDEX_URL" ]; then \
        pip install "torch==${TORCH_VERSION}" --index-url "$TORCH_INDEX_URL" ; \
    else \
        pip install "torch==${TORCH_VERSION}" ; \
    fi
WORKDIR /opt/pyrsia
COPY pyproject.toml README.md ./
COPY persia ./persia
COPY pyrsia ./pyrsia
RUN if ls /opt/wheelhouse/*.whl >/dev/null 2>&1; then \
        pip install --no-index --find-links /opt/wheelhouse . ; \
    else \
        pip install . ; \
    fi \
    && cd / && python -m pyrsia.services.warmup

FROM runtime
# the venv, with the numba kernels the warm-up above compiled into it (run outside
# /opt/pyrsia, so that it imports the installed package and not the source tree)
COPY --from=build /opt/venv /opt/venv
WORKDIR /workspace
ENTRYPOINT ["persia-launcher"]
