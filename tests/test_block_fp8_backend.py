"""The launcher's block-FP8 linear backend on a GPU host without nvcc (serving/block_fp8.py): vLLM's prebuilt CUTLASS
kernel for block-FP8 layers, merged into the user's kernel_config and checked by vLLM's own parser and KernelConfig,
and every case where the user's choice or an nvcc leaves vLLM's own pick."""
from __future__ import annotations

import json
import os
import stat

import pytest

from serving import block_fp8, launcher

CUTLASS = {block_fp8.QUANT_SCHEME: "cutlass"}


@pytest.fixture(scope="module")
def va():
    from serving.vllm_args import VllmArgs
    return VllmArgs()


@pytest.fixture
def gpu_build(monkeypatch):
    monkeypatch.setattr(launcher, "is_cpu_build", lambda: False)


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


def kernel_config(p) -> dict | None:
    a = p.argv
    return json.loads(a[a.index("--kernel-config") + 1]) if "--kernel-config" in a else None


def test_without_nvcc_block_fp8_layers_run_cutlass_as_vllm_parses_it(va, tmp_path, gpu_build, no_nvcc):
    p = plan(va, tmp_path, no_nvcc)
    config = kernel_config(p)
    assert config == {"linear_backend_per_quant": CUTLASS}
    assert any("no nvcc on this host: block-FP8 linear layers" in n for n in p.notes), p.notes
    assert p.argv.count("--kernel-config") == 1 and "--linear-backend" not in p.argv
    from vllm.config import KernelConfig
    assert KernelConfig(**config).linear_backend_per_quant == CUTLASS
    assert KernelConfig(**config).linear_backend == "auto"  # every other layer as vLLM picks it


def test_merged_into_the_users_kernel_config(va, tmp_path, gpu_build, no_nvcc):
    user = {"moe_backend": "triton", "linear_backend_per_quant": {"nvfp4_w4a16": "marlin"}}
    p = plan(va, tmp_path, {**no_nvcc, "OPTION_KERNEL_CONFIG": json.dumps(user)})
    assert kernel_config(p) == {"moe_backend": "triton",
                                "linear_backend_per_quant": {"nvfp4_w4a16": "marlin", **CUTLASS}}
    assert p.argv.count("--kernel-config") == 1


@pytest.mark.parametrize("env", [
    {"OPTION_LINEAR_BACKEND": "deep_gemm"},
    {"OPTION_KERNEL_CONFIG": '{"linear_backend": "triton"}'},
    {"OPTION_KERNEL_CONFIG": json.dumps({"linear_backend_per_quant": {block_fp8.QUANT_SCHEME: "deep_gemm"}})},
])
def test_the_users_own_backend_wins(va, tmp_path, gpu_build, no_nvcc, env):
    p = plan(va, tmp_path, {**no_nvcc, **env})
    given = env.get("OPTION_KERNEL_CONFIG")
    assert kernel_config(p) == (json.loads(given) if given else None)
    assert not any("block-FP8" in n for n in p.notes), p.notes


def test_a_kernel_config_that_is_no_object_is_left_alone_with_a_note(va, tmp_path, gpu_build, no_nvcc):
    entries = {"kernel_config": type("R", (), {"raw": "[1]", "source": "env OPTION_KERNEL_CONFIG"})()}
    config, note = block_fp8.kernel_config(entries, no_nvcc, cpu_build=False)
    assert config is None and "kernel_config (env OPTION_KERNEL_CONFIG) is not a JSON object" in note


@pytest.mark.parametrize("where", ["PATH", "CUDA_HOME"])
def test_with_nvcc_on_path_or_cuda_home_vllm_picks(va, tmp_path, gpu_build, with_nvcc, where):
    env = ({"PATH": str(with_nvcc.parent) + os.pathsep + "/nonexistent", "CUDA_HOME": "/nonexistent"}
           if where == "PATH" else {"PATH": "/nonexistent", "CUDA_HOME": str(with_nvcc.parent.parent)})
    assert block_fp8.nvcc_path(env) == with_nvcc
    assert kernel_config(plan(va, tmp_path, env)) is None


def test_nothing_on_the_cpu_build(va, tmp_path, no_nvcc):
    p = plan(va, tmp_path, no_nvcc)  # this machine is the CPU build
    assert kernel_config(p) is None and not any("block-FP8" in n for n in p.notes)
