"""entrypoint.sh: SageMaker's `serve` starts the launcher; anything else runs as given."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

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
    assert "vllm.entrypoints.openai.api_server" in r.stdout.splitlines()[-1]


def test_other_commands_pass_through():
    r = run("sh", "-c", "echo passed $0", "through")
    assert (r.returncode, r.stdout) == (0, "passed through\n")


def test_configuration_error_exit_code_reaches_the_caller(tmp_path):
    r = run("serve", env_extra={"SERVING_MODEL_DIR": str(tmp_path), "OPTION_NOT_A_SETTING": "1"})
    assert r.returncode == 2
    assert "configuration error: not_a_setting from env OPTION_NOT_A_SETTING" in r.stderr
