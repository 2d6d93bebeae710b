#!/bin/sh
# Container entry point. SageMaker starts the container as `docker run IMAGE serve`;
# `serve` (or no argument) starts the launcher, which execs vLLM's OpenAI server.
# Anything else runs as given (e.g. `python -m serving --dry-run`, `bash`).
set -e
here=$(dirname "$(readlink -f "$0")")
PY=${SERVING_PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x "$here/.venv/bin/python" ]; then PY="$here/.venv/bin/python"; else PY=python3; fi
fi
if [ "$#" -eq 0 ] || [ "$1" = "serve" ]; then
    [ "$#" -gt 0 ] && shift
    PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m serving "$@"
fi
exec "$@"
