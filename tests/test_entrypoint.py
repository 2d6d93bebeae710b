"""entrypoint.sh: SageMaker's `serve` starts the launcher; anything else runs as given."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args, env_extra=None, cwd="/"):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_VLLM_", "HF_"))}
    env.update(env_extra or {})
    return subprocess.run([str(ROOT / "entrypoint.sh"), *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300)


def test_serve_runs_the_launcher_from_any_directory(tmp_path):
    r = run("serve", "--dry-run", env_extra={"SERVING_MODEL_DIR": str(tmp_path), "SM_NUM_GPUS": "1"})
    assert r.returncode == 0, r.stderr
    assert "setting tensor_parallel_size=1  [env SM_NUM_GPUS; vLLM --tensor-parallel-size]" in r.stdout
    assert " -m vllm.entrypoints.cli.main serve " in r.stdout.splitlines()[-1]


def test_other_commands_pass_through():
    r = run("sh", "-c", "echo passed $0", "through")
    assert (r.returncode, r.stdout) == (0, "passed through\n")


def test_configuration_error_exit_code_reaches_the_caller(tmp_path):
    r = run("serve", env_extra={"SERVING_MODEL_DIR": str(tmp_path), "OPTION_NOT_A_SETTING": "1"})
    assert r.returncode == 2
    assert "configuration error: not_a_setting from env OPTION_NOT_A_SETTING" in r.stderr


def _driver(tmp_path, line: str | None):
    """A stand-in cuda-compat folder (CUDA 13.0's libraries come from driver 580.82.07) and driver version file."""
    compat = tmp_path / "compat"
    compat.mkdir(exist_ok=True)
    (compat / "libcuda.so.580.82.07").write_bytes(b"")
    if not (compat / "libcuda.so.1").is_symlink():
        (compat / "libcuda.so.1").symlink_to("libcuda.so.580.82.07")
    from serving.settings import TABLE

    (compat_name,), (driver_name,) = TABLE["cuda_compat_dir"].env_names, TABLE["driver_version_file"].env_names
    env = {compat_name: str(compat), driver_name: str(tmp_path / "version"), "LD_LIBRARY_PATH": "/usr/lib/x"}
    if line is not None:
        (tmp_path / "version").write_text(line + "\nGCC version:  gcc version 12.2.0\n")
    return compat, env


@pytest.mark.parametrize("line,older", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024", True),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.144.03  Release Build  Mon Dec 30 2024", True),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.82.07  Release Build  Wed Aug 27 2025", False),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.44.01  Release Build  Tue Nov 18 2025", False),
    (None, False),  # no NVIDIA driver (CPU host)
])
def test_cuda_forward_compat_libraries_only_under_an_older_driver(tmp_path, line, older):
    compat, env = _driver(tmp_path, line)
    r = run("sh", "-c", 'echo "$LD_LIBRARY_PATH"', env_extra=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (f"{compat}:/usr/lib/x\n" if older else "/usr/lib/x\n")
    said = [l for l in r.stderr.splitlines() if "forward-compatibility" in l]
    assert len(said) == (1 if older else 0)
    if older:
        assert "is older than 580.82.07" in said[0]
