"""Run bench/inductor_kernel_probe.py's launch of a generated kernel under Triton's interpreter on the CPU
(TRITON_INTERPRET=1 in the environment, read at import, so a process of its own): run 17's Q/K RMSNorm + RoPE kernel
(triton_red_fused_1 from stock's compile cache), its inputs rebuilt at 3 tokens, under three configs. Prints one JSON
object: whether the configs agreed, and each output's largest difference from a float32 reference of RMSNorm of each
head (eps 1e-6, the weight) followed by NeoX RoPE from the cos/sin cache at each position. The interpreter has no
libdevice.rsqrt: Triton's tl.math.rsqrt stands in for it."""
from __future__ import annotations

import json
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

from bench.inductor_kernel_probe import check_equal, inputs, launcher, load

ROOT = Path(__file__).resolve().parents[1]
TARBALL = ROOT / "bench" / "data" / "h200_block_17" / "inductor-kernels.tar.gz"


def reference(qkv, q_w, positions, cache, k_w, heads=8, head_dim=128):
    def norm_rope(x, w):
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
        cos, sin = cache.float()[positions][:, None, :head_dim // 2], cache.float()[positions][:, None, head_dim // 2:]
        x1, x2 = x[..., :head_dim // 2], x[..., head_dim // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    t = qkv.shape[0]
    q = qkv[:, :heads * head_dim].view(t, heads, head_dim)
    k = qkv[:, heads * head_dim:(heads + 1) * head_dim].view(t, 1, head_dim)
    return norm_rope(q, q_w), norm_rope(k, k_w)


def main() -> None:
    work = Path(tempfile.mkdtemp())
    with tarfile.open(TARBALL) as tar:
        tar.extractall(work, filter="data")
    source = next(p for p in sorted((work / "homes").glob("*.stock/**/inductor_cache/*/*.py"))
                  if "def triton_red_fused_1(" in p.read_text() and p.read_text().count("@triton.jit") == 1)
    kernel, get_args_src = load(source)
    # the interpreter has no libdevice.rsqrt; Triton's own tl.math.rsqrt stands in (on the GPU: libdevice's)
    import triton.language as tl
    kernel.fn.__globals__["libdevice"] = tl.math
    torch.manual_seed(0)
    args = inputs(get_args_src, 8192, 3, "cpu")
    qkv, q_w, positions, cache, k_w, q_out, k_out, n0, n1 = args
    positions.copy_(torch.tensor([0, 5, 4095]))  # the file's zeros at 3 tokens, made distinct positions
    configs = [(2, 128, 2), (2, 64, 2), (4, 64, 4)]
    check_equal(kernel, args, configs)
    launcher(kernel, args, configs[1])()
    q_ref, k_ref = reference(qkv, q_w, positions, cache, k_w)
    print(json.dumps({"shapes": [list(qkv.shape), list(q_out.shape), list(k_out.shape)], "xnumel": [n0, n1],
                      "configs_agree": True, "q_err": (q_out.float() - q_ref).abs().max().item(),
                      "k_err": (k_out.float() - k_ref).abs().max().item(),
                      "q_scale": q_ref.abs().max().item()}))


if __name__ == "__main__":
    sys.exit(main())
