"""DeepGEMM off on a GPU host where its JIT finds no nvcc (serving/deep_gemm.py): the engine's environment gets
VLLM_USE_DEEP_GEMM=0, which vLLM's own backend choice reads, and the user's setting or an nvcc leaves it alone."""
from __future__ import annotations

import os
import stat

import pytest

from serving import deep_gemm, launcher


@pytest.fixture
def no_nvcc(tmp_path):
    return {"PATH": str(tmp_path / "bin"), "CUDA_HOME": str(tmp_path / "cuda")}


@pytest.fixture
def with_nvcc(tmp_path):
    bin_dir = tmp_path / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    nvcc = bin_dir / "nvcc"  # a stand-in: only its presence is looked at
    nvcc.write_text("#!/bin/sh\nexit 0\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    return nvcc


def plan(va, tmp_path, env):
    return launcher.plan({"SERVING_MODEL_DIR": str(tmp_path), **env}, va)


def test_without_nvcc_the_engine_runs_without_deep_gemm(va, tmp_path, gpu_build, no_nvcc, monkeypatch):
    p = plan(va, tmp_path, no_nvcc)
    assert p.env[deep_gemm.ENV] == "0"
    assert any(n.startswith("no nvcc on this host for DeepGEMM's JIT: VLLM_USE_DEEP_GEMM=0") for n in p.notes)
    # vLLM reads it as DeepGEMM off, set explicitly: the condition its MoE-backend choice (oracle/fp8.py) removes
    # DeepGEMM on, and its linear kernel's is_deep_gemm_supported() reads
    monkeypatch.setenv(deep_gemm.ENV, p.env[deep_gemm.ENV])
    import vllm.envs as envs
    assert envs.is_set(deep_gemm.ENV) and envs.VLLM_USE_DEEP_GEMM is False


@pytest.mark.parametrize("value", ["0", "1"])
def test_the_users_own_setting_wins(va, tmp_path, gpu_build, no_nvcc, value):
    p = plan(va, tmp_path, {**no_nvcc, deep_gemm.ENV: value})
    assert p.env[deep_gemm.ENV] == value and not any("DeepGEMM" in n for n in p.notes)


@pytest.mark.parametrize("where", ["PATH", "CUDA_HOME", "DG_JIT_NVCC_COMPILER"])
def test_with_an_nvcc_vllm_picks(va, tmp_path, gpu_build, with_nvcc, where):
    env = {"PATH": "/nonexistent", "CUDA_HOME": "/nonexistent"}
    if where == "PATH":
        env["PATH"] = str(with_nvcc.parent) + os.pathsep + "/nonexistent"
    elif where == "CUDA_HOME":
        env["CUDA_HOME"] = str(with_nvcc.parent.parent)
    else:
        env[deep_gemm.COMPILER_ENV] = str(with_nvcc)
    assert deep_gemm.nvcc_path(env) == with_nvcc
    assert deep_gemm.ENV not in plan(va, tmp_path, env).env


def test_a_compiler_setting_that_is_not_executable_counts_as_none(tmp_path):
    assert deep_gemm.nvcc_path({deep_gemm.COMPILER_ENV: str(tmp_path / "missing"), "PATH": ""}) is None


def test_nothing_on_the_cpu_build(va, tmp_path, no_nvcc):
    p = plan(va, tmp_path, no_nvcc)  # this machine is the CPU build
    assert deep_gemm.ENV not in p.env and not any("DeepGEMM" in n for n in p.notes)
