"""bench/kernels/decode_gemm.py where it runs on the CPU: the shapes it times (each shard's dense layers and routers,
as the engine bench's presets make them) and its refusal to run without a GPU."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.kernels import decode_gemm as bench

ROOT = Path(__file__).resolve().parents[1]


def test_dense_shapes_are_each_shards_qkv_and_o_proj_once():
    dense, routers = bench.shard_shapes()
    # the 235B EP8 rank: 8 query heads and 1 KV head of 128 (TP8 attention), hidden 4096
    assert dense["qwen3-235b-a22b-ep8 qkv"] == (1280, 4096) and dense["qwen3-235b-a22b-ep8 o_proj"] == (4096, 1024)
    # the Coder under DP8 + EP8 keeps every head: 96 + 2 x 8 of 128 over hidden 6144
    assert dense["qwen3-coder-480b-a35b-ep8 qkv"] == (14336, 6144)
    assert len(set(dense.values())) == len(dense)  # DeepSeek-V3's TP8 rank repeats its EP8 rank's shapes: once
    # DeepSeek-V3's TP8 rank in its own architecture: MLA's q_b (16 heads of 128 + 64 from the query's rank of 1,536)
    # and the shared expert's gate_up (2 x 2,048 / 8); its o_proj (7,168 <- 16 x 128) is the stand-in's, listed once
    assert dense["deepseek-v3-tp8-mla q_b_proj"] == (3072, 1536)
    assert dense["deepseek-v3-tp8-mla shared gate_up"] == (512, 7168)
    assert dense["deepseek-v3-ep8 o_proj"] == (7168, 2048) and "deepseek-v3-tp8-mla o_proj" not in dense
    assert all(n % bench.BLOCK == 0 and k % bench.BLOCK == 0 for n, k in dense.values())
    # local routers of the EP8 ranks; the TP4 ranks' routers are the checkpoints' full ones, timed once
    assert routers == {"qwen3-235b-a22b-ep8 local router": (4096, 16),
                       "qwen3-coder-480b-a35b-ep8 local router": (6144, 20),
                       "deepseek-v3-ep8 local router": (7168, 32)}


def test_triton_grid_keeps_the_weight_blocks_k():
    assert all(c["BLOCK_SIZE_K"] == bench.BLOCK for c in bench.TRITON_GRID)
    assert set(map(str, bench.QUICK_GRID)) < set(map(str, bench.TRITON_GRID))


def test_refuses_to_run_without_a_gpu(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU, on a GPU host too
    r = subprocess.run([sys.executable, "-m", "bench.kernels.decode_gemm", "--quick", "--out", str(tmp_path)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "no CUDA device here" in r.stderr
    assert not list(tmp_path.iterdir())


def test_split_k_grid_keeps_the_weight_blocks_k_and_small_m_keys():
    from bench.kernels.small_m_configs import KEYS

    assert all(c["BLOCK_SIZE_K"] == bench.BLOCK and tuple(c) == KEYS for c in bench.SPLIT_GRID)
    assert set(map(str, bench.QUICK_SPLIT_GRID)) < set(map(str, bench.SPLIT_GRID))


def test_the_gemv_grid_tiles_every_shards_dense_shape():
    """The decode GEMM bench has at least one GEMV dict for every shard's dense shape (by gemv_tiles, which
    tests/test_block_fp8_small_m.py holds to patch 0010's check), and its quick grid is part of the full one."""
    dense, _ = bench.shard_shapes()
    assert set(map(str, bench.QUICK_GEMV_GRID)) < set(map(str, bench.GEMV_GRID))
    for name, (n, k) in dense.items():
        assert [c for c in bench.GEMV_GRID if bench.gemv_tiles(c, n, k)], name


def test_a_graphs_calls_take_their_weights_in_turn_from_sets_larger_than_l2():
    """weight_sets: the weights themselves first, then copies (same values, other memory) until the sets hold
    ROTATED_BYTES (the kernel harness's); rotating: each call takes the next set, the first call the weights
    themselves (the one the reference check sees), and comes round again after the last."""
    import torch

    w = torch.ones(256, 512, dtype=torch.bfloat16)  # 256 KiB
    ws = torch.full((2, 4), 0.5)
    sets = bench.weight_sets(w, ws, total=1 << 20)
    assert len(sets) == 4 and sets[0][0] is w and sets[0][1] is ws
    assert sum(t.numel() * t.element_size() for s in sets for t in s) >= 1 << 20
    assert len({s[0].data_ptr() for s in sets}) == 4 and all(torch.equal(s[0], w) and torch.equal(s[1], ws)
                                                             for s in sets)
    seen = []
    call = bench.rotating(lambda a, b: seen.append(a.data_ptr()) or a, sets)
    assert call() is w
    for _ in range(4):
        call()
    assert seen == [s[0].data_ptr() for s in sets] + [w.data_ptr()]
    # the H200 default: even the largest dense weight of a shard (the Coder's qkv, 88 MB) comes in 3 sets
    assert bench.ROTATED_BYTES > 50 << 20
    assert len(bench.weight_sets(torch.empty(14336, 6144, dtype=torch.uint8))) == 3
    # a router's few hundred KiB: no more sets than a graph's calls take
    assert len(bench.weight_sets(torch.empty(16, 4096, dtype=torch.bfloat16))) == bench.CALLS


def test_above_32_tokens_the_split_k_kernel_also_tries_taller_tiles():
    """Up to 32 tokens the grid given (quick or full); above, where a decode step of 33-128 requests runs CUTLASS at
    its 32-token time, a grid with 32- and 64-row tiles (8 warps for the tallest) that holds the quick grid too; each
    config keeps the weight block's K and the small-M file's keys, and the table names a tall tile and its warps."""
    from bench.kernels.small_m_configs import KEYS

    assert bench.split_grid_for(32, bench.QUICK_SPLIT_GRID) is bench.QUICK_SPLIT_GRID
    tall = bench.split_grid_for(33, bench.QUICK_SPLIT_GRID)
    assert tall is bench.split_grid_for(128, bench.SPLIT_GRID) is bench.TALL_SPLIT_GRID
    assert all(c["BLOCK_SIZE_K"] == bench.BLOCK and tuple(c) == KEYS for c in tall)
    assert set(map(str, bench.QUICK_SPLIT_GRID)) < set(map(str, tall))
    assert {(c["BLOCK_SIZE_M"], c["num_warps"]) for c in tall} == {(16, 4), (32, 4), (64, 4), (64, 8)}
    assert bench.split_label(bench.QUICK_SPLIT_GRID[0]) == "N32 K/1 s3"
    assert bench.split_label(dict(tall[-1])) == "M64 w8 N128 K/8 s3"


def test_a_token_count_below_one_is_refused_before_anything_runs(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.kernels.decode_gemm", "--tokens", "64", "0",
                        "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--tokens: token counts are 1 or more, not 0" in r.stderr
    assert not list(tmp_path.iterdir())
