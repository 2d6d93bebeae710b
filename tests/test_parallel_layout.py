"""The parallel layout the launcher picks from a checkpoint's config.json and the GPU count
(serving/parallel_layout.py), on the official checkpoints' own config.json files (tests/data/checkpoint_configs/, no
weights) at 1-8 GPUs.

The machine runs the CPU build: the launcher decides as on the GPU build (the gpu_build fixture), with the GPUs that
CUDA_VISIBLE_DEVICES lists. Each prediction of how vLLM holds the experts is checked against vLLM's own functions
(refine_fp8_moe_block_shape, pad_tp_shard_to_weight_blocks, validate_fp8_block_shape_moe), called on the same shapes.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from serving import launcher, parallel_layout, resolve
from serving.parallel_layout import Checkpoint, moe_split

CONFIGS = Path(__file__).parent / "data" / "checkpoint_configs"
QWEN_235B, CODER, DEEPSEEK, QWEN_30B, MIXTRAL = (
    "Qwen3-235B-A22B-FP8", "Qwen3-Coder-480B-A35B-Instruct-FP8", "DeepSeek-V3", "Qwen3-30B-A3B-FP8",
    "Mixtral-8x7B-Instruct-v0.1")

# (checkpoint, GPUs) -> expert parallelism chosen, each GPU's N of every expert's gate/up weight
EXPECTED = {
    (QWEN_235B, 1): (False, 1536), (QWEN_235B, 2): (False, 768), (QWEN_235B, 4): (False, 384),
    (QWEN_235B, 8): (True, 1536),
    (CODER, 1): (False, 2560), (CODER, 2): (False, 1280), (CODER, 4): (False, 640), (CODER, 8): (True, 2560),
    (DEEPSEEK, 1): (False, 2048), (DEEPSEEK, 2): (False, 1024), (DEEPSEEK, 4): (False, 512),
    (DEEPSEEK, 8): (False, 256),
    (QWEN_30B, 1): (False, 768), (QWEN_30B, 2): (False, 384), (QWEN_30B, 4): (True, 768), (QWEN_30B, 8): (True, 768),
    (MIXTRAL, 1): (False, 14336), (MIXTRAL, 2): (False, 7168), (MIXTRAL, 4): (False, 3584), (MIXTRAL, 8): (False, 1792),
}


def checkpoint(name: str) -> Checkpoint:
    return Checkpoint.from_config(json.loads((CONFIGS / name / "config.json").read_text()))


def gpus(n: int) -> str:
    return ",".join(str(i) for i in range(n))


def plan_for(va, tmp_path, name: str, n: int, **env) -> launcher.Plan:
    model_dir = tmp_path / "opt-ml-model"
    model_dir.mkdir(exist_ok=True)
    return launcher.plan({"SERVING_MODEL_DIR": str(model_dir), "OPTION_MODEL_ID": str(CONFIGS / name),
                          "CUDA_VISIBLE_DEVICES": gpus(n), **env}, va)


def layout_line(p: launcher.Plan) -> str:
    lines = [n for n in p.notes if n.startswith(parallel_layout.NOTE + ":")]
    assert len(lines) == 1, p.notes
    return lines[0]


def test_the_five_official_configs_are_there():
    assert sorted(p.name for p in CONFIGS.iterdir() if p.is_dir()) == sorted({n for n, _ in EXPECTED})
    assert checkpoint(QWEN_235B).block == checkpoint(CODER).block == checkpoint(DEEPSEEK).block == (128, 128)
    assert checkpoint(MIXTRAL).block is None
    assert (checkpoint(DEEPSEEK).experts, checkpoint(DEEPSEEK).dense_mlps) == (256, (("dense MLP", 18432),
                                                                                     ("shared expert", 2048)))


@pytest.mark.parametrize("name,n", sorted(EXPECTED), ids=[f"{a}-{b}gpu" for a, b in sorted(EXPECTED)])
def test_the_launcher_picks_a_layout_with_whole_blocks_per_gpu(va, tmp_path, gpu_build, name, n):
    ep, per_gpu = EXPECTED[name, n]
    p = plan_for(va, tmp_path, name, n)
    line = layout_line(p)
    assert p.settings.tensor_parallel_size == n
    assert ("--enable-expert-parallel" in p.argv) is ep, p.argv
    assert (p.resolved.get("enable_expert_parallel") is not None) is ep
    assert f"N {per_gpu}" in line and "refined" not in line.split(": expert parallelism chosen")[0], line
    if ep:
        assert f"EP{n} experts" in line and "expert parallelism chosen" in line, line
        assert p.resolved["enable_expert_parallel"].source.startswith("default (")
    else:
        assert f"TP{n} experts" in line and "chosen" not in line, line
    # the layout is one vLLM serves: whole blocks per GPU, attention and dense layers as vLLM's checks take them
    ck = checkpoint(name)
    split = moe_split(ck, n, 1, ep, "auto")
    assert split.on_block and split.n == per_gpu
    assert parallel_layout.dense_refusal(ck, n) is None
    if ck.block:
        vllm_moe_check(split.n, split.tp, ck.block)  # raises where vLLM would refuse the shard


def vllm_moe_check(n: int, tp: int, block) -> None:
    """vLLM's own block check of a GPU's expert shard (validate_fp8_block_shape_moe), at that TP size."""
    import vllm.distributed
    from vllm.model_executor.layers.quantization.utils.fp8_utils import validate_fp8_block_shape_moe

    mp = pytest.MonkeyPatch()
    mp.setattr(vllm.distributed, "get_tensor_model_parallel_world_size", lambda: tp)
    try:
        validate_fp8_block_shape_moe(n, list(block))
    finally:
        mp.undo()


def vllm_moe_config(ck: Checkpoint, split, lora=False):
    """The fields of vLLM's FusedMoEConfig that its block-shape functions read, for one GPU's shard."""
    return SimpleNamespace(intermediate_size_per_partition=split.n, intermediate_size=ck.moe_n, hidden_dim=ck.hidden,
                           tp_size=split.tp, ep_size=split.ep, is_lora_enabled=lora, has_bias=False,
                           tp_shard_with_padding=False)


@pytest.mark.parametrize("name,n", [(QWEN_235B, 8), (CODER, 8), (QWEN_30B, 4), (QWEN_30B, 8), (QWEN_30B, 16)])
def test_the_tensor_parallel_split_is_predicted_as_vllm_handles_it(name, n):
    """Without expert parallelism these split the experts off the block: the launcher's reading of what vLLM then
    does (refine the scales, pad the shard, refuse) is what vLLM's functions do on the same shapes."""
    from vllm.model_executor.layers.fused_moe.oracle.fp8 import (pad_tp_shard_to_weight_blocks,
                                                                  refine_fp8_moe_block_shape)
    ck = checkpoint(name)
    auto = moe_split(ck, n, 1, False, "auto")
    refined = refine_fp8_moe_block_shape(vllm_moe_config(ck, auto), list(ck.block))
    if refined is None:
        assert auto.how == "refused", auto
        with pytest.raises(ValueError, match="not divisible by weight quantization block_n"):
            vllm_moe_check(auto.n, auto.tp, ck.block)
    else:
        assert auto.how.startswith(f"scales refined to {refined[0]}x{refined[1]} blocks"), auto
    for lora in (False, True):  # a named MoE backend that takes no refined block: vLLM pads, or refuses with LoRA
        named = moe_split(ck, n, 1, False, "flashinfer_cutlass", lora)
        config = vllm_moe_config(ck, named, lora)
        if named.how == "refused":
            with pytest.raises(ValueError, match="Block-aligned FP8 TP sharding requires"):
                pad_tp_shard_to_weight_blocks(config, list(ck.block))
        else:
            assert pad_tp_shard_to_weight_blocks(config, list(ck.block)) is True
            assert f"N {config.intermediate_size_per_partition}" in named.how, named
        assert (named.how == "refused") is lora


def test_dry_run_shows_the_layout_and_why(tmp_path, gpu_build, launcher_main):
    rc, out, err = launcher_main({"OPTION_MODEL_ID": str(CONFIGS / QWEN_235B), "CUDA_VISIBLE_DEVICES": gpus(8),
                                  "SERVING_MODEL_DIR": str(tmp_path)}, ["--dry-run"])
    assert rc == 0, err
    line = next(l for l in out.splitlines() if l.startswith("layout:"))
    assert "TP8: EP8 experts (16 of 128 per GPU, N 1536, whole blocks): expert parallelism chosen: at TP8 each GPU " \
           "would hold N 192 of every expert's gate/up weight, not a multiple of the 128-block" in line, line
    assert "enable_expert_parallel=false keeps tensor parallelism" in line
    assert "setting enable_expert_parallel=True  [default (Qwen3MoeForCausalLM: whole experts per GPU)" in out
    command = out.splitlines()[-1]
    assert " --enable-expert-parallel " in command and " --tensor-parallel-size 8 " in command, command

    rc, out, err = launcher_main({"OPTION_MODEL_ID": str(CONFIGS / DEEPSEEK), "CUDA_VISIBLE_DEVICES": gpus(8),
                                  "SERVING_MODEL_DIR": str(tmp_path)}, ["--dry-run"])
    assert rc == 0, err
    assert "layout: DeepseekV3ForCausalLM (block FP8 [128, 128], 256 experts, moe_intermediate_size 2048) on TP8: " \
           "TP8 experts (N 256 of 2048 per GPU, whole blocks)" in out
    assert "expert-parallel" not in out.splitlines()[-1]


def test_a_layout_the_user_forces_that_vllm_serves_is_kept_and_said(va, tmp_path, gpu_build):
    p = plan_for(va, tmp_path, QWEN_235B, 8, OPTION_ENABLE_EXPERT_PARALLEL="false", OPTION_MOE_BACKEND="triton")
    line = layout_line(p)
    assert "--enable-expert-parallel" not in p.argv
    assert "TP8 experts (N 192 of 1536 per GPU, scales refined to 64x64 blocks" in line, line
    assert "(enable_expert_parallel from env OPTION_ENABLE_EXPERT_PARALLEL)" in line
    p = plan_for(va, tmp_path, QWEN_30B, 4, OPTION_TENSOR_PARALLEL_DEGREE="2")  # the user's TP splits on the block
    assert "--enable-expert-parallel" not in p.argv and "TP2 experts (N 384 of 768" in layout_line(p)


@pytest.mark.parametrize("env,n,name,named", [
    ({"OPTION_ENABLE_EXPERT_PARALLEL": "false", "OPTION_MOE_BACKEND": "flashinfer_cutlass",
      "OPTION_ENABLE_LORA": "true"}, 8, QWEN_235B, ("env OPTION_ENABLE_EXPERT_PARALLEL", "N 192",
                                                   "moe_intermediate_size 1536", "tensor_parallel_size=8")),
    ({"OPTION_ENABLE_EXPERT_PARALLEL": "false", "OPTION_MOE_BACKEND": "auto", "OPTION_TENSOR_PARALLEL_DEGREE": "16"},
     16, QWEN_30B, ("env OPTION_ENABLE_EXPERT_PARALLEL", "N 48", "not a multiple of block_n 128",
                    "env OPTION_TENSOR_PARALLEL_DEGREE")),
    ({"OPTION_TENSOR_PARALLEL_DEGREE": "3"}, 4, MIXTRAL, ("tensor_parallel_size from env OPTION_TENSOR_PARALLEL_DEGREE",
                                                          "32 attention heads are not divisible by tensor parallel "
                                                          "size 3")),
    ({"OPTION_ENABLE_EXPERT_PARALLEL": "true"}, 1, "dense", ("env OPTION_ENABLE_EXPERT_PARALLEL", "no experts")),
], ids=["235b-tp8-no-ep-lora", "30b-tp16-no-ep", "mixtral-tp3", "ep-without-experts"])
def test_a_layout_vllm_refuses_exits_2_with_one_line(tmp_path, gpu_build, launcher_main, env, n, name, named):
    if name == "dense":  # a checkpoint without experts
        cfg = json.loads((CONFIGS / MIXTRAL / "config.json").read_text())
        del cfg["num_local_experts"]
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        model = tmp_path / name
    else:
        model = CONFIGS / name
    rc, out, err = launcher_main({"OPTION_MODEL_ID": str(model), "CUDA_VISIBLE_DEVICES": gpus(n),
                                  "SERVING_MODEL_DIR": str(tmp_path), **env}, ["--dry-run"])
    errors = [l for l in err.splitlines() if l.startswith("configuration error:")]
    assert rc == 2 and out == "" and len(errors) == 1, err
    for part in named:
        assert part in errors[0], errors[0]


def test_the_config_is_read_from_the_model_directory_and_the_hub_cache(va, tmp_path, gpu_build):
    # /opt/ml/model holding the checkpoint
    model_dir = tmp_path / "opt-ml-model"
    shutil.copytree(CONFIGS / CODER, model_dir)
    p = launcher.plan({"SERVING_MODEL_DIR": str(model_dir), "CUDA_VISIBLE_DEVICES": gpus(8)}, va)
    assert p.model_source == "model-dir" and "EP8 experts (20 of 160 per GPU" in layout_line(p)
    # a hub id whose config.json is in the Hugging Face cache (the layout huggingface_hub writes)
    hub = tmp_path / "hf" / "hub"
    snapshot = hub / "models--Qwen--Qwen3-235B-A22B-FP8" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    shutil.copy(CONFIGS / QWEN_235B / "config.json", snapshot / "config.json")
    (hub / "models--Qwen--Qwen3-235B-A22B-FP8" / "refs").mkdir()
    (hub / "models--Qwen--Qwen3-235B-A22B-FP8" / "refs" / "main").write_text("a" * 40)
    (tmp_path / "empty").mkdir()
    env = {"SERVING_MODEL_DIR": str(tmp_path / "empty"), "CUDA_VISIBLE_DEVICES": gpus(8),
           "OPTION_MODEL_ID": "Qwen/Qwen3-235B-A22B-FP8", "HF_HOME": str(tmp_path / "hf")}
    p = launcher.plan(env, va)
    assert p.model_source == "hub" and "--enable-expert-parallel" in p.argv and "EP8" in layout_line(p)
    # not in the cache, nor downloaded yet: one line, and vLLM's own checks
    p = launcher.plan({**env, "OPTION_MODEL_ID": "Qwen/Qwen3-30B-A3B-FP8"}, va)
    assert layout_line(p) == (f"layout: not checked: Qwen/Qwen3-30B-A3B-FP8's config.json is not in the Hugging Face "
                              f"cache ({hub}); vLLM checks it while loading")
    assert "--enable-expert-parallel" not in p.argv
    p = launcher.plan({**env, "OPTION_MODEL_ID": "s3://bucket/qwen3/", "SERVING_DOWNLOAD_DIR": str(tmp_path / "dl")},
                      va)
    assert layout_line(p).startswith(f"layout: not checked: {tmp_path / 'dl' / 'config.json'} is not downloaded yet")


def test_data_parallel_counts_in_the_expert_split():
    """Without expert parallelism vLLM splits the experts over TP x DP; with it, over TP x DP GPUs whole."""
    ck = checkpoint(QWEN_235B)
    assert moe_split(ck, 4, 2, False).n == 192 and moe_split(ck, 4, 2, False).tp == 8
    both = moe_split(ck, 4, 2, True)
    assert (both.ep, both.tp, both.n, both.on_block) == (8, 1, 1536, True)
    entries = {"tensor_parallel_size": resolve.Resolved("tensor_parallel_size", "4", 4, "env X"),
               "data_parallel_size": resolve.Resolved("data_parallel_size", "2", "2", "env Y",
                                                      flag="--data-parallel-size")}
    d = parallel_layout.decide(ck, entries, None)
    assert d.default is not None and d.default.key == "enable_expert_parallel" and "on TP4 x DP2: EP8" in d.note


def test_the_layouts_page_says_what_the_launcher_picks():
    """docs/layouts.md's table is the launcher's choice: EP where it picks EP, and each GPU's N."""
    page = (Path(__file__).parents[1] / "docs" / "layouts.md").read_text()
    rows = {}
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and any(cells[0].startswith(n.split("-Instruct")[0]) for n, _ in EXPECTED):
            rows[next(n for n, _ in EXPECTED if cells[0].startswith(n.split("-Instruct")[0]))] = cells[1:]
    assert set(rows) == {n for n, _ in EXPECTED}, rows
    for (name, n), (ep, per_gpu) in EXPECTED.items():
        cell = rows[name][[1, 2, 4, 8].index(n)].replace("**", "")
        assert cell.startswith(f"TP{n}") and ("EP" in cell) is ep, (name, n, cell)
        assert n == 1 or name == MIXTRAL or f"N {per_gpu}" in cell, (name, n, cell)


def test_an_s3_model_is_laid_out_once_its_config_is_downloaded(moto_env, tmp_path, gpu_build, launcher_main):
    """Before the download there is no config.json to read: the launcher plans again after it, and the start log
    says the layout from the downloaded config (the real S3 API of a moto server on loopback)."""
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="layouts")
    s3.upload_file(str(CONFIGS / QWEN_235B / "config.json"), "layouts", "qwen/config.json")
    rc, out, err = launcher_main({"SERVING_MODEL_DIR": str(tmp_path / "none"), "OPTION_MODEL_ID": "s3://layouts/qwen/",
                                  "SERVING_DOWNLOAD_DIR": str(tmp_path / "dl"), "CUDA_VISIBLE_DEVICES": gpus(8)},
                                 ["--prepare-only"])
    assert rc == 0, err[-3000:]
    assert "layout: not checked: " in err and "is not downloaded yet" in err  # the first plan's line
    after = err.split("download of s3://layouts/qwen/ complete")[1]
    assert "layout: Qwen3MoeForCausalLM (block FP8 [128, 128], 128 experts, moe_intermediate_size 1536) on TP8: EP8 " \
           "experts (16 of 128 per GPU" in after, err[-3000:]
