"""Run one of tests/*_check.py in a process of its own and read the JSON object it prints last.

The check scripts run what must not share the test process: Triton's interpreter (TRITON_INTERPRET is read when
Triton is imported) or vLLM's single-rank distributed state."""
from __future__ import annotations

import contextlib
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


def run_check(script: str, *, triton_interpret: bool = False, timeout: int = 600) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    if triton_interpret:
        env["TRITON_INTERPRET"] = "1"
    r = subprocess.run([sys.executable, str(ROOT / "tests" / script)], cwd=ROOT, capture_output=True, text=True,
                       env=env, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
