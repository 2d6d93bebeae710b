#!/bin/sh
# Container entry point. SageMaker starts the container as `docker run IMAGE serve`;
# `serve` (or no argument) starts the launcher, which execs vLLM's OpenAI server.
# Anything else runs as given (e.g. `python -m serving --dry-run`, `bash`).
set -e
here=$(dirname "$(readlink -f "$0")")

# CUDA forward compatibility, as LMI does: the image's CUDA 13 user space needs driver R580+. When
# the host's driver is older than the driver the image's cuda-compat libraries come from, put those
# first on the library path (datacenter GPUs; NVIDIA's forward-compatibility rules apply).
compat=${SERVING_CUDA_COMPAT_DIR:-/usr/local/cuda/compat}
driver_file=${SERVING_DRIVER_VERSION_FILE:-/proc/driver/nvidia/version}
if [ -e "$compat/libcuda.so.1" ] && [ -r "$driver_file" ]; then
    host_driver=$(sed -n 's/.*  \([0-9][0-9]*\.[0-9][0-9.]*\)  .*/\1/p' "$driver_file" | head -n 1)
    compat_driver=$(basename "$(readlink -f "$compat/libcuda.so.1")" | sed -n 's/^libcuda\.so\.\([0-9.]*\)$/\1/p')
    compat_driver=${compat_driver:-580}
    if [ -n "$host_driver" ] && [ "$host_driver" != "$compat_driver" ] &&
       [ "$(printf '%s\n%s\n' "$host_driver" "$compat_driver" | sort -V | head -n 1)" = "$host_driver" ]; then
        export LD_LIBRARY_PATH="$compat${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "entrypoint: host NVIDIA driver $host_driver is older than $compat_driver (the image's CUDA): using the CUDA forward-compatibility libraries in $compat" >&2
    fi
fi

PY=${SERVING_PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x "$here/.venv/bin/python" ]; then PY="$here/.venv/bin/python"; else PY=python3; fi
fi
if [ "$#" -eq 0 ] || [ "$1" = "serve" ]; then
    [ "$#" -gt 0 ] && shift
    PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m serving "$@"
fi
exec "$@"
