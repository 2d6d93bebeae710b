"""The FP8 kernels the launcher chooses (serving/kernels.py), over the host layouts where vLLM's, DeepGEMM's and
FlashInfer's nvcc lookups disagree: nvcc only under the default CUDA folder, only on PATH, named by
DG_JIT_NVCC_COMPILER, or nowhere. Every layout gets the same default kernels in the plan and in --dry-run; a
JIT-compiled backend the user chooses is refused at once where its own JIT's rule finds no nvcc."""
from __future__ import annotations

import json
import os

import pytest

from serving import kernels, launcher
from serving.exit_codes import ExitCode
from serving.resolve import ConfigError

BLOCK_QUANT = "block"
TENSOR_QUANT = "tensor"
LAYOUTS = ("default-cuda-only", "path-only", "dg-compiler", "none")
MEASURED = ["--linear-backend", "cutlass", "--moe-backend", "triton"]


def fake_nvcc(folder):
    """An executable named nvcc in folder/bin (a stand-in: the rules look at where it is, not what it does)."""
    nvcc = folder / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True, exist_ok=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0'\n")
    nvcc.chmod(0o755)
    return nvcc


@pytest.fixture
def host(tmp_path, monkeypatch):
    """host(layout) -> the environment of a host of that layout: its default CUDA folder (kernels.DEFAULT_CUDA_HOME,
    /usr/local/cuda on a real host) is a temp folder, with nvcc in it only for default-cuda-only."""
    default = tmp_path / "usr-local-cuda"
    default.mkdir()
    monkeypatch.setattr(kernels, "DEFAULT_CUDA_HOME", str(default))
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()

    def make(layout: str) -> dict[str, str]:
        env = {"PATH": str(empty_bin), "CUDA_VISIBLE_DEVICES": "0"}
        if layout == "default-cuda-only":
            fake_nvcc(default)
        elif layout == "path-only":
            env["PATH"] = f"{fake_nvcc(tmp_path / 'toolkit').parent}{os.pathsep}{empty_bin}"
        elif layout == "dg-compiler":
            env[kernels.DG_COMPILER_ENV] = str(fake_nvcc(tmp_path / "dg"))
        return env
    return make


def model(tmp_path, scheme: str | None, name: str = "m"):
    """A model folder holding the config.json of the 235B EP8 shard's preset (bench.e2e.shards) in FP8 scheme
    `scheme` ("block", "tensor"), or bf16 (None)."""
    from bench.e2e.shards import preset_spec
    from serving.tiny_model import _config

    folder = tmp_path / name
    folder.mkdir()
    spec = preset_spec("qwen3-235b-a22b-ep8", layers=2, fp8=scheme is not None, fp8_scheme=scheme or "tensor")
    (folder / "config.json").write_text(json.dumps(_config(spec, 1, 2)))
    return folder


def plan(va, tmp_path, folder, env):
    return launcher.plan({"SERVING_MODEL_DIR": str(tmp_path / "none"), "OPTION_MODEL_ID": str(folder), **env}, va)


def engine_flags(p) -> list[str]:
    out = []
    for flag in ("--linear-backend", "--moe-backend"):
        if flag in p.argv:
            out += [flag, p.argv[p.argv.index(flag) + 1]]
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_host_layout_gets_the_measured_block_fp8_kernels(va, tmp_path, gpu_build, host, layout):
    p = plan(va, tmp_path, model(tmp_path, BLOCK_QUANT), host(layout))
    assert engine_flags(p) == MEASURED
    assert p.env[kernels.DEEP_GEMM_ENV] == "0"
    assert p.resolved["linear_backend"].source.startswith("default (block FP8")
    assert not any("compiles its kernels with nvcc" in n for n in p.notes)
    assert any(n.startswith(f"{kernels.NOTE}: block FP8 checkpoint: linear_backend=cutlass") for n in p.notes)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dry_run_shows_the_same_kernels_on_every_layout(tmp_path, gpu_build, host, launcher_main, layout):
    folder = model(tmp_path, BLOCK_QUANT)
    rc, out, err = launcher_main({**host(layout), "OPTION_MODEL_ID": str(folder),
                                  "SERVING_MODEL_DIR": str(tmp_path / "none")}, ["--dry-run"])
    assert rc == ExitCode.OK, err
    assert "setting linear_backend=cutlass  [default (block FP8" in out
    assert "setting moe_backend=triton  [default (block FP8" in out
    assert "--linear-backend cutlass" in out and "--moe-backend triton" in out


def test_expert_parallelism_keeps_triton(va, tmp_path, gpu_build, host):
    p = plan(va, tmp_path, model(tmp_path, BLOCK_QUANT), {**host("path-only"), "OPTION_ENABLE_EXPERT_PARALLEL": "true"})
    assert engine_flags(p) == MEASURED and "--enable-expert-parallel" in p.argv


def test_per_tensor_fp8_gets_cutlass_and_triton_unless_the_stock_order_is_asked_for(va, tmp_path, gpu_build, host):
    folder = model(tmp_path, TENSOR_QUANT)
    assert engine_flags(plan(va, tmp_path, folder, host("none"))) == MEASURED
    stock = plan(va, tmp_path, folder, {**host("none"), "OPTION_FP8_MOE_STOCK_ORDER": "true"})
    assert engine_flags(stock) == ["--linear-backend", "cutlass"]


def test_a_model_that_is_not_fp8_keeps_vllms_choice(va, tmp_path, gpu_build, host):
    p = plan(va, tmp_path, model(tmp_path, None), host("path-only"))
    assert engine_flags(p) == [] and p.env[kernels.DEEP_GEMM_ENV] == "0"


@pytest.mark.parametrize("env", [{"OPTION_LINEAR_BACKEND": "triton", "OPTION_MOE_BACKEND": "cutlass"},
                                 {"SM_VLLM_LINEAR_BACKEND": "triton", "SM_VLLM_MOE_BACKEND": "cutlass"},
                                 {"OPTION_KERNEL_CONFIG": '{"linear_backend": "triton", "moe_backend": "cutlass"}'}])
def test_the_users_choice_wins(va, tmp_path, gpu_build, host, env):
    p = plan(va, tmp_path, model(tmp_path, BLOCK_QUANT), {**host("none"), **env})
    if "OPTION_KERNEL_CONFIG" in env:  # vLLM reads both from kernel_config: the launcher adds neither flag
        assert engine_flags(p) == [] and "--kernel-config" in p.argv
    else:
        assert engine_flags(p) == ["--linear-backend", "triton", "--moe-backend", "cutlass"]
    assert any(n.startswith(f"{kernels.NOTE}: block FP8 checkpoint: linear_backend=triton (env ") for n in p.notes)


@pytest.mark.parametrize("layout", ["default-cuda-only", "path-only", "dg-compiler"])
def test_deep_gemm_opted_in_runs_where_its_jit_finds_nvcc(va, tmp_path, gpu_build, host, layout):
    p = plan(va, tmp_path, model(tmp_path, BLOCK_QUANT), {**host(layout), kernels.DEEP_GEMM_ENV: "1"})
    assert engine_flags(p) == ["--linear-backend", "deep_gemm", "--moe-backend", "deep_gemm"]
    assert p.env[kernels.DEEP_GEMM_ENV] == "1"
    line, = [n for n in p.notes if "compiles its kernels with nvcc at start" in n]
    assert line.startswith(f"{kernels.NOTE}: DeepGEMM (linear_backend=deep_gemm") and "42-48 minutes" in line


def test_deep_gemm_opted_in_without_nvcc_stops_the_start(tmp_path, gpu_build, host, launcher_main):
    rc, out, err = launcher_main({**host("none"), kernels.DEEP_GEMM_ENV: "1", "SERVING_MODEL_DIR": str(tmp_path / "no"),
                                  "OPTION_MODEL_ID": str(model(tmp_path, BLOCK_QUANT))}, ["--dry-run"])
    assert rc == ExitCode.CONFIG_ERROR and out == ""
    line, = [x for x in err.splitlines() if x.startswith("configuration error")]
    assert "VLLM_USE_DEEP_GEMM=1" in line and "DeepGEMM compiles its kernels with nvcc at start" in line


def test_flashinfer_blockscale_gemm_needs_nvcc_on_path(va, tmp_path, gpu_build, host):
    """The layout where the start crashed while vLLM's default was left alone: nvcc only under the default CUDA
    folder, which FlashInfer's module build finds and its GEMM runtime (`nvcc` from PATH) does not."""
    folder = model(tmp_path, BLOCK_QUANT)
    with pytest.raises(ConfigError) as e:
        plan(va, tmp_path, folder, {**host("default-cuda-only"), "OPTION_LINEAR_BACKEND": "flashinfer_cutlass"})
    assert str(e.value).startswith("linear_backend from env OPTION_LINEAR_BACKEND: flashinfer_cutlass: FlashInfer's "
                                   "blockscale GEMM compiles its kernels with nvcc at start, and its JIT finds none")
    p = plan(va, tmp_path, folder, {**host("path-only"), "OPTION_LINEAR_BACKEND": "flashinfer_cutlass"})
    assert engine_flags(p) == ["--linear-backend", "flashinfer_cutlass", "--moe-backend", "triton"]
    assert any("FlashInfer's blockscale GEMM (linear_backend=flashinfer_cutlass from env OPTION_LINEAR_BACKEND) "
               "compiles its kernels with nvcc at start" in n for n in p.notes)


def test_flashinfer_cutlass_moe_builds_with_the_default_cuda_folder(va, tmp_path, gpu_build, host):
    folder = model(tmp_path, BLOCK_QUANT)
    with pytest.raises(ConfigError, match="^moe_backend from env OPTION_MOE_BACKEND: flashinfer_cutlass"):
        plan(va, tmp_path, folder, {**host("none"), "OPTION_MOE_BACKEND": "flashinfer_cutlass"})
    p = plan(va, tmp_path, folder, {**host("default-cuda-only"), "OPTION_MOE_BACKEND": "flashinfer_cutlass"})
    assert any("FlashInfer's CUTLASS MoE" in n and "12 minutes" in n for n in p.notes)


def test_the_jit_rules_follow_cuda_home(tmp_path, host):
    env = host("path-only")
    assert kernels.deep_gemm_nvcc(env) and kernels.flashinfer_nvcc(env, gemm_runtime=True)
    # a CUDA_HOME without nvcc wins over PATH in both JITs
    assert kernels.deep_gemm_nvcc({**env, "CUDA_HOME": str(tmp_path)}) is None
    assert kernels.flashinfer_nvcc({**env, "CUDA_HOME": str(tmp_path)}) is None
    assert kernels.deep_gemm_nvcc({"PATH": "", kernels.DG_COMPILER_ENV: str(tmp_path / "missing")}) is None


def test_nothing_on_the_cpu_build(va, tmp_path, host):
    p = plan(va, tmp_path, model(tmp_path, BLOCK_QUANT), host("none"))  # this machine is the CPU build
    assert engine_flags(p) == [] and kernels.DEEP_GEMM_ENV not in p.env
