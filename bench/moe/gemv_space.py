"""The configs bench/moe_gemv_probe.py tries for patch 0011's decode fused-MoE kernel (`lmi_fused_moe_gemv_kernel`
in the patched fused_moe.py: one program per routed pair and BLOCK_SIZE_N output rows, a matrix-vector product over
K in BLOCK_SIZE_K-wide steps on CUDA cores, block scales per 128-group)."""
from __future__ import annotations


def candidate_configs(space: str = "default") -> list[dict]:
    """Narrow N tiles for many programs, wide K steps for bytes in flight. "wide" goes past the default's edges
    (kernel probe 19b's first call found its best at the narrowest N and the widest K)."""
    if space == "wide":
        return [{"BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "num_warps": w, "num_stages": s}
                for bn in (2, 4, 8) for bk in (512, 1024, 2048) for w in (2, 4, 8) for s in (1, 2, 3)]
    return [{"BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "num_warps": w, "num_stages": s}
            for bn in (8, 16, 32) for bk in (256, 512) for w in (4, 8) for s in (2, 4)]
