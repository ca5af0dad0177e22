# Stand-in bases for the serving image: `dsaops image base --arch T` (dsaops/image_base.py) builds
# them from a Debian root filesystem it imports and a folder of wheels it downloads beforehand (the
# build context), so no RUN step here touches the network. They carry what the real base would:
#   nvidia: a Python with CPU torch, TileLang and its needs, nvcc (the nvidia-cuda-nvcc wheels) and
#           g++, so the serving build's `kernels` stage compiles for real; no CUDA driver, no GPU;
#   rocm:   the same Python with the pinned SGLang wheel installed --no-deps, as the ROCm base
#           carries SGLang; no ROCm.
# Both also carry the exporter's dependencies and setproctitle, so the `app` stage installs offline.

ARG DEBIAN_IMAGE

FROM ${DEBIAN_IMAGE} AS common
SHELL ["/bin/bash", "-eo", "pipefail", "-c"]
ENV PATH=/opt/dsaops/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
ARG COMMON_REQUIREMENTS
# hadolint ignore=DL3013,DL3042,SC2086
RUN --mount=type=bind,source=wheels,target=/tmp/wheels \
    python3 -m venv /opt/dsaops/venv \
    && pip install --no-index --find-links /tmp/wheels $COMMON_REQUIREMENTS

FROM common AS nvidia
ARG NVIDIA_REQUIREMENTS
# hadolint ignore=DL3013,DL3042,SC2086
RUN --mount=type=bind,source=wheels,target=/tmp/wheels \
    pip install --no-index --find-links /tmp/wheels $NVIDIA_REQUIREMENTS \
    && python3 -c 'import tilelang.env as e; assert e.CUDA_HOME, "TileLang finds no nvcc"; print("nvcc under", e.CUDA_HOME)'
ARG STANDIN_KEY
LABEL dsaops.standin.key=$STANDIN_KEY

FROM common AS rocm
ARG SGLANG_WHEEL
# hadolint ignore=DL3013,DL3042
RUN --mount=type=bind,source=wheels,target=/tmp/wheels \
    pip install --no-index --no-deps "/tmp/wheels/$SGLANG_WHEEL"
ARG STANDIN_KEY
LABEL dsaops.standin.key=$STANDIN_KEY
