"""Run one of tests/*_check.py in a process of its own and read the JSON object it prints last.

The check scripts run what must not share the test process: Triton's interpreter (TRITON_INTERPRET is read when
Triton is imported) or vLLM's single-rank distributed state."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def env_set(name: str, value: str):
    """name=value in os.environ inside the block (a check script's switch), the earlier value or none after it."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name)
        if saved is not None:
            os.environ[name] = saved


def patched_definitions(relpath: str, names, patch: str, prefix: str):
    """The named top-level definitions of the installed vLLM's file `relpath` (below vllm/, found without importing
    vLLM), cut out as a module of their own that runs real Triton (bench.moe.kernel_source.load_definitions); exits
    naming `patch` where a name is missing."""
    from bench.moe.kernel_source import load_definitions

    path = os.path.join(importlib.util.find_spec("vllm").submodule_search_locations[0], relpath)
    try:
        return load_definitions(path, names, prefix)
    except RuntimeError as e:  # a name not found
        raise SystemExit(f"{e}: patch {patch} is not applied")


def run_check(script: str, *, triton_interpret: bool = False, timeout: int = 600) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    if triton_interpret:
        env["TRITON_INTERPRET"] = "1"
    r = subprocess.run([sys.executable, str(ROOT / "tests" / script)], cwd=ROOT, capture_output=True, text=True,
                       env=env, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
