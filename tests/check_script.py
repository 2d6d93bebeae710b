"""Run one of tests/*_check.py in a process of its own and read the JSON object it prints last.

The check scripts run what must not share the test process: Triton's interpreter (TRITON_INTERPRET is read when
Triton is imported) or vLLM's single-rank distributed state. They need no engine but up to minutes of CPU, so the
session runs them in the background (tests/conftest.py, "checks in the background": check_fixture)."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Check:
    """tests/<script> (or a script's absolute path) with args, run by this Python from the repository's root with the
    repository on its path."""

    script: str
    args: tuple[str, ...] = ()
    triton_interpret: bool = False
    env: dict[str, str] = field(default_factory=dict)

    def command(self) -> list[str]:
        # by path: a package named `tests` in site-packages (smdebug_rulesconfig, through sagemaker-core) would
        # shadow this folder for `python -m tests....`
        return [sys.executable, str(ROOT / "tests" / self.script), *self.args]

    def environ(self, base: dict[str, str]) -> dict[str, str]:
        env = dict(base, **self.env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        if self.triton_interpret:
            env["TRITON_INTERPRET"] = "1"
        return env


def check_result(check: Check, returncode: int, stdout: str, stderr: str) -> dict:
    """The JSON object a finished check printed last; fails the test with the check's error output otherwise."""
    lines = stdout.strip().splitlines()
    assert returncode == 0 and lines, \
        f"{check.script} exited {returncode}{'' if lines else ' and printed nothing'}:\n{stderr[-3000:]}"
    return json.loads(lines[-1])


def vllm_file(relpath: str) -> Path:
    """The installed vLLM's file `relpath` (below vllm/), found without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None, "vLLM is not installed (make venv)"
    return Path(spec.submodule_search_locations[0]) / relpath


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
    vLLM), cut out as a module of their own that runs real Triton (bench.kernels.moe.kernel_source.load_definitions);
    exits naming `patch` where a name is missing."""
    from bench.kernels.moe.kernel_source import load_definitions

    try:
        return load_definitions(str(vllm_file(relpath)), names, prefix)
    except RuntimeError as e:  # a name not found
        raise SystemExit(f"{e}: patch {patch} is not applied")
