"""bench/prompt_gemm_probe.py where it runs on the CPU: the environment it gives DeepGEMM's JIT (the runtime's own
nvcc, found where its wheel puts it, and the CCCL flag), the shards it times, and its refusal to run without a GPU."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from bench import prompt_gemm_probe as probe
from serving import deep_gemm

ROOT = Path(__file__).resolve().parents[1]


def _site_with_nvcc(tmp_path: Path) -> Path:
    nvcc = tmp_path / "site-packages" / "nvidia" / "cu13" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\nexit 0\n")
    nvcc.chmod(0o755)
    return tmp_path / "site-packages"


def test_deep_gemm_gets_the_runtimes_nvcc_and_the_cccl_flag(tmp_path):
    site = _site_with_nvcc(tmp_path)
    assert deep_gemm.runtime_nvcc(site) == site / "nvidia" / "cu13" / "bin" / "nvcc"
    env = probe.deep_gemm_env(site, {"NVCC_APPEND_FLAGS": "-lineinfo"}, paths=())
    assert env == {"VLLM_USE_DEEP_GEMM": "1", "VLLM_USE_DEEP_GEMM_E8M0": "0",
                   "NVCC_APPEND_FLAGS": f"-lineinfo {deep_gemm.CCCL_FLAG}",
                   deep_gemm.COMPILER_ENV: str(site / "nvidia" / "cu13" / "bin" / "nvcc"),
                   "CUDA_HOME": str(site / "nvidia" / "cu13")}  # its headers, not a host toolkit's
    # an nvcc the user named stays theirs; a site without the wheel names none
    named = probe.deep_gemm_env(site, {deep_gemm.COMPILER_ENV: "/opt/nvcc"})
    assert deep_gemm.COMPILER_ENV not in named and "CUDA_HOME" not in named
    assert deep_gemm.COMPILER_ENV not in probe.deep_gemm_env(tmp_path / "empty", {})
    # the CPU build's torch comes without CUDA's wheels: no nvcc of its own
    assert deep_gemm.runtime_nvcc(Path(torch.__file__).resolve().parents[1]) is None


def test_the_cuda_runtimes_headers_from_another_site_are_added_where_the_nvcc_has_none(tmp_path):
    """A venv over a host's site-packages (the lease hosts): the nvcc's wheel in the venv, the CUDA runtime's wheel,
    whose include/ holds cuda_runtime.h, in the host's site. DeepGEMM's JIT takes its headers from CUDA_HOME only, so
    the runtime's include folder is added with -I; where the nvcc's own folder has them (the image), nothing is."""
    site = _site_with_nvcc(tmp_path / "venv")
    host = tmp_path / "host"
    include = host / "nvidia" / "cu13" / "include"
    include.mkdir(parents=True)
    paths = (str(tmp_path / "elsewhere"), str(site), str(host))
    assert probe.runtime_headers(paths) is None  # no header yet: nothing to add
    assert probe.deep_gemm_env(site, {}, paths)["NVCC_APPEND_FLAGS"] == deep_gemm.CCCL_FLAG
    (include / probe.RUNTIME_HEADER).write_text("")
    env = probe.deep_gemm_env(site, {}, paths)
    assert env["NVCC_APPEND_FLAGS"] == f"{deep_gemm.CCCL_FLAG} -I{include}"
    assert env["CUDA_HOME"] == str(site / "nvidia" / "cu13")
    own = site / "nvidia" / "cu13" / "include"
    own.mkdir()
    (own / probe.RUNTIME_HEADER).write_text("")
    assert probe.deep_gemm_env(site, {}, paths)["NVCC_APPEND_FLAGS"] == deep_gemm.CCCL_FLAG


def test_the_default_shards_are_the_three_ep8_ranks():
    from bench.decode_gemm_bench import SHARD_PRESETS, shard_shapes

    assert set(probe.DEFAULT_PRESETS) <= set(SHARD_PRESETS)
    dense, _ = shard_shapes(probe.DEFAULT_PRESETS)
    assert dense["qwen3-235b-a22b-ep8 qkv"] == (1280, 4096)
    assert max(probe.PROMPT_TOKENS) == 8192  # the image's max_num_batched_tokens (run 35's start log)


def test_refuses_to_run_without_a_gpu(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU, on a GPU host too
    r = subprocess.run([sys.executable, "-m", "bench.prompt_gemm_probe", "--out", str(tmp_path)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "no CUDA device here" in r.stderr
    assert not list(tmp_path.iterdir())


def test_a_failed_arm_keeps_the_compilers_own_words_from_the_middle_of_its_error():
    """A JIT's error is its command line, the compiler's own words, then (DeepGEMM's) a C++ stack trace: the record
    keeps the start, every line between that names an error, and the end."""
    from bench.decode_gemm_bench import failure

    command = "nvcc " + " ".join(f"-I/include/{i}" for i in range(400))
    stack = "\n".join(f"  #{i} /site-packages/deep_gemm/_C.so+0x{i:x} <unknown function> at ??:0" for i in range(40))
    text = failure(RuntimeError(f"command failed with exit code 1:\n{command}\n"
                                f"/include/cuda/std/__cccl/compiler.h(41): error: CCCL requires at least CUDA 13.1\n"
                                f"1 error detected in the compilation\n{stack}"))
    assert text.startswith("RuntimeError('command failed") and text.endswith("at ??:0')")
    assert "[...] /include/cuda/std/__cccl/compiler.h(41): error: CCCL requires at least CUDA 13.1 [...]" in text
    assert "1 error detected in the compilation" in text and len(text) < 2000
    assert failure(ValueError("short")) == "ValueError('short')"
