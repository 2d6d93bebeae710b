"""The launcher's warning for a block-FP8 checkpoint on a GPU host without nvcc (vLLM 0.32 would JIT-compile
FlashInfer's block-scaled linear kernel at the first start)."""
from __future__ import annotations

import os
import stat

import pytest

from serving.launcher import block_fp8_jit_note, nvcc_path
from serving.tiny_model import TinySpec, make


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    small = dict(layers=1, hidden=128, heads=2, kv_heads=1, head_dim=64, experts=4, top_k=2, moe_intermediate=128,
                 vocab=512)
    return {scheme: make(root / scheme, TinySpec(**small, fp8=True, fp8_scheme=scheme))
            for scheme in ("block", "tensor")}


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


def test_block_fp8_without_nvcc_names_the_fix(models, no_nvcc):
    note = block_fp8_jit_note(str(models["block"]), {}, no_nvcc)
    assert note is not None
    assert "[128, 128]" in note and "OPTION_LINEAR_BACKEND=cutlass" in note and "nvcc" in note


def test_no_note_when_the_linear_backend_is_chosen(models, no_nvcc):
    assert block_fp8_jit_note(str(models["block"]), {"linear_backend": object()}, no_nvcc) is None


def test_no_note_for_per_tensor_fp8(models, no_nvcc):
    assert block_fp8_jit_note(str(models["tensor"]), {}, no_nvcc) is None


@pytest.mark.parametrize("where", ["PATH", "CUDA_HOME"])
def test_nvcc_found_on_path_or_cuda_home(models, with_nvcc, where):
    env = ({"PATH": str(with_nvcc.parent) + os.pathsep + "/nonexistent", "CUDA_HOME": "/nonexistent"}
           if where == "PATH" else {"PATH": "/nonexistent", "CUDA_HOME": str(with_nvcc.parent.parent)})
    assert nvcc_path(env) == with_nvcc
    assert block_fp8_jit_note(str(models["block"]), {}, env) is None


def test_unreadable_model_folder_gives_no_note(tmp_path, no_nvcc):
    assert block_fp8_jit_note(str(tmp_path / "missing"), {}, no_nvcc) is None
