"""The MoE layer shapes the harness times, and the batch sizes vLLM's tuner and warm-up use.

N is the MoE intermediate size per rank, the vLLM config-file N: the w13 GEMM
outputs 2N, the w2 GEMM reduces over N. E is the experts one rank holds.

An expert-parallel rank (``-ep8``) holds E/8 of the experts and sees every token,
of which about one in eight picks each local expert: top-k 8 over 128 (or 160,
256) experts gives 1 expected (token, local expert) pair per token. The shapes
time that with top-1 over the local experts, the same number of pairs and the
same weights read per step; vLLM's own EP path launches the kernel over the
global top-k with non-local pairs skipped, which these shapes do not time
(``ep``: the deployment's global experts and top-k, for a check that does).
"""
from __future__ import annotations


SHAPES = {
    "qwen3-235b-tp8": dict(E=128, topk=8, H=4096, N=192, block=None),
    "qwen3-coder-480b-tp8": dict(E=160, topk=8, H=6144, N=320, block=None),
    "mixtral-8x7b-tp8": dict(E=8, topk=2, H=4096, N=1792, block=None),
    "deepseek-v3-tp8": dict(E=256, topk=8, H=7168, N=256, block=[128, 128]),
    "qwen3-30b-a3b-tp1": dict(E=128, topk=8, H=2048, N=768, block=None),
    # the official block-FP8 checkpoints as vLLM's recipes deploy them (one rank)
    "qwen3-235b-ep8": dict(E=16, topk=1, H=4096, N=1536, block=[128, 128], ep=(128, 8)),
    "qwen3-coder-480b-ep8": dict(E=20, topk=1, H=6144, N=2560, block=[128, 128], ep=(160, 8)),
    "deepseek-v3-ep8": dict(E=32, topk=1, H=7168, N=2048, block=[128, 128], ep=(256, 8)),
    "qwen3-235b-tp4": dict(E=128, topk=8, H=4096, N=384, block=[128, 128]),
    "qwen3-coder-480b-tp4": dict(E=160, topk=8, H=6144, N=640, block=[128, 128]),
}

TP8_SHAPES = ["qwen3-235b-tp8", "qwen3-coder-480b-tp8", "mixtral-8x7b-tp8", "deepseek-v3-tp8"]


# vLLM benchmarks/kernels/benchmark_moe.py batch sizes
TUNER_MS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]


def gemm_dims(shape, gemm):
    """(N_out, K_in) of the weight tensor B (E, N_out, K_in)."""
    if gemm == "w13":
        return 2 * shape["N"], shape["H"]
    return shape["H"], shape["N"]


def vllm_warmup_ms(max_tokens=8192, max_capture=512):
    # vLLM V1 cudagraph capture sizes [1, 2, 4] + range(8, 256, 8) + range(256, max+1, 16)
    # plus the profile / dummy run at max_num_batched_tokens
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_capture + 1, 16))
    return sizes + [max_tokens]
