"""The kernel launch as vLLM 0.32 does it, without importing vLLM.

* ``moe_align_block_size_torch`` -- torch version of vLLM's CUDA op (same
  buffer sizes, same padding value ``numel``, same block->expert layout).
* ``prepare_assignment`` -- ``_prepare_expert_assignment`` (naive block
  assignment when ``naive_assignment``).
* ``invoke`` -- ``invoke_fused_moe_triton_kernel`` for fp8 w8a8, per-tensor
  scales or [128,128] block scales; swap-AB decided like ``enable_swap_ab``
  (capability 9.0, BM < 64, BN >= 64) unless overridden.
"""
from __future__ import annotations

import torch

from .configs import CFG_KEYS, cfg_str


def naive_assignment(M, E, topk) -> bool:
    """vLLM 0.32's rule (_prepare_expert_assignment): few routed tokens per expert get one block
    each, with no alignment. naive_block_assignment is a kernel constexpr: each side compiles."""
    return M * topk * 4 <= E


def naive_assignment_max_m(E, topk) -> int:
    """The largest M that takes naive_assignment (0: none)."""
    return E // (4 * topk)


def moe_align_block_size_torch(topk_ids: torch.Tensor, block_size: int, num_experts: int):
    dev = topk_ids.device
    numel = topk_ids.numel()
    max_num_tokens_padded = numel + num_experts * (block_size - 1)
    if numel < num_experts:
        max_num_tokens_padded = min(numel * block_size, max_num_tokens_padded)
    max_num_m_blocks = -(-max_num_tokens_padded // block_size)
    flat = topk_ids.reshape(-1).to(torch.int64)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_size - 1) // block_size * block_size
    pad_off = torch.cumsum(padded, 0) - padded  # exclusive
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order]
    cnt_off = torch.cumsum(counts, 0) - counts
    rank = torch.arange(numel, device=dev) - cnt_off[sorted_e]
    dest = pad_off[sorted_e] + rank
    sorted_ids = torch.full((max_num_tokens_padded,), numel, dtype=torch.int32, device=dev)
    sorted_ids[dest] = order.to(torch.int32)
    nblk = padded // block_size
    blk_expert = torch.repeat_interleave(torch.arange(num_experts, device=dev), nblk)
    expert_ids = torch.zeros((max_num_m_blocks,), dtype=torch.int32, device=dev)
    expert_ids[: blk_expert.numel()] = blk_expert.to(torch.int32)
    ntpp = padded.sum().reshape(1).to(torch.int32)
    return sorted_ids, expert_ids, ntpp


def prepare_assignment(topk_ids, BM, E, M, topk):
    """vLLM 0.32 _prepare_expert_assignment (no expert_map)."""
    if naive_assignment(M, E, topk):
        return (
            None,
            topk_ids.reshape(-1),
            torch.full((1,), topk_ids.numel() * BM, dtype=torch.int32, device=topk_ids.device),
        )
    return moe_align_block_size_torch(topk_ids, BM, E)


def is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def enable_swap_ab(BM, BN) -> bool:
    return is_hopper() and BM < 64 and BN >= 64


def swap_of(config: dict, swap_ab=None) -> bool:
    """swap-AB as the patched launcher decides: forced by the caller, else the
    config's SWAP_AB key (patch 0003), else vLLM's rule."""
    if swap_ab is not None:
        return bool(swap_ab)
    if "SWAP_AB" in config:
        return bool(config["SWAP_AB"])
    return enable_swap_ab(config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"])


class _WarmupOnly:
    """Stands in for a jit kernel: kernel[grid](...) compiles, launches nothing."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        return lambda *a, **k: self.kernel.warmup(*a, grid=grid, **k)


def invoke(kmod, A, B, C, A_scale, B_scale, topk_weights, sorted_ids, expert_ids, ntpp,
           mul_routed_weight, top_k, config, block_shape, compute_type=None, swap_ab=None, warmup=False):
    """invoke_fused_moe_triton_kernel (vLLM 0.32) for fp8 w8a8."""
    import triton
    import triton.language as tl

    if compute_type is None:
        compute_type = tl.bfloat16 if C.dtype == torch.bfloat16 else tl.float32
    SWAP_AB = swap_of(config, swap_ab)
    if block_shape is not None:
        assert triton.cdiv(B.size(-2), block_shape[0]) == B_scale.size(-2)
        assert triton.cdiv(B.size(-1), block_shape[1]) == B_scale.size(-1)
    M = A.size(0)
    num_tokens = M * top_k
    if sorted_ids is not None:
        EM = sorted_ids.size(0)
        if A.size(0) < config["BLOCK_SIZE_M"]:
            EM = min(sorted_ids.size(0), A.size(0) * top_k * config["BLOCK_SIZE_M"])
    else:
        EM = num_tokens * config["BLOCK_SIZE_M"]
    cfg = {k: config[k] for k in CFG_KEYS}
    cfg["SPLIT_K"] = 1
    BLOCK_SIZE_K = cfg.pop("BLOCK_SIZE_K")
    if block_shape is not None:
        BLOCK_SIZE_K = min(BLOCK_SIZE_K, min(block_shape[0], block_shape[1]))
    grid = (triton.cdiv(EM, cfg["BLOCK_SIZE_M"]) * triton.cdiv(B.size(1), cfg["BLOCK_SIZE_N"]),)
    if A_scale is not None and A_scale.ndim == 0:
        A_scale = A_scale.reshape(1)
    split_k = config.get("SPLIT_K", 1)
    if split_k > 1:
        # patch 0004: vLLM's own launcher of fused_moe_kernel_split_k
        if not hasattr(kmod, "_invoke_fused_moe_kernel_split_k"):
            raise RuntimeError(f"{cfg_str(config)} needs fused_moe_kernel_split_k (patch 0004) in the kernel source")
        real = kmod.fused_moe_kernel_split_k
        if warmup:
            kmod.fused_moe_kernel_split_k = _WarmupOnly(real)
        try:
            if kmod._invoke_fused_moe_kernel_split_k(
                A, B, C, None, A_scale, B_scale, topk_weights, sorted_ids, expert_ids, ntpp, EM, num_tokens,
                mul_routed_weight, top_k, compute_type, True, False, block_shape, SWAP_AB, BLOCK_SIZE_K,
                split_k, cfg,
            ):
                return
        finally:
            kmod.fused_moe_kernel_split_k = real
    kfn = kmod.fused_moe_kernel[grid] if not warmup else _WarmupOnly(kmod.fused_moe_kernel)[grid]
    kfn(
        A, B, C, None, A_scale, B_scale, topk_weights, sorted_ids, expert_ids, ntpp,
        B.size(1), B.size(2), EM, num_tokens,
        A.stride(0), A.stride(1), B.stride(0), B.stride(2), B.stride(1), C.stride(1), C.stride(2),
        A_scale.stride(0) if A_scale is not None and A_scale.ndim == 2 else 0,
        A_scale.stride(1) if A_scale is not None and A_scale.ndim == 2 else 0,
        B_scale.stride(0) if B_scale is not None and B_scale.ndim >= 2 else 0,
        B_scale.stride(2) if B_scale is not None and B_scale.ndim == 3 else 0,
        B_scale.stride(1) if B_scale is not None and B_scale.ndim >= 2 else 0,
        0, 0,
        0 if block_shape is None else block_shape[0],
        0 if block_shape is None else block_shape[1],
        MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k, compute_type=compute_type,
        use_fp8_w8a8=True, use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False,
        naive_block_assignment=(sorted_ids is None), HAS_BIAS=False, BLOCK_SIZE_K=BLOCK_SIZE_K,
        SWAP_AB=SWAP_AB, USE_TD=False, **cfg,
    )
