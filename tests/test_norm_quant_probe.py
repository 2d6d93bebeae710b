"""bench/norm_quant_probe.py's check, on the CPU: its compiled functions (one fused, and norm and quantization apart)
give the eager functions' values, up to the order compiled kernels sum in. The timing needs the H200."""
from __future__ import annotations

import torch

from bench import norm_quant_probe


def test_the_compiled_norm_and_quantization_match_the_eager_ones():
    r = norm_quant_probe.probe(256, 2, torch.device("cpu"), timed=False)
    assert len(r["fused_relerr"]) == 3 and len(r["two_relerr"]) == 2
    assert max(r["fused_relerr"] + r["two_relerr"]) < 0.05, r
    assert r["fused_relerr"][2] == 0.0  # the residual sum is exact in both


def test_group_quant_scales_are_powers_of_two_with_ue8m0():
    y = torch.randn(3, 512, dtype=torch.bfloat16)
    q, s = norm_quant_probe.group_quant(y, ue8m0=True)
    assert s.shape == (3, 4) and torch.equal(torch.exp2(torch.log2(s).round()), s)
    back = (q.float().view(3, 4, 128) * s[..., None]).view(3, 512)
    assert ((back - y.float()).norm() / y.float().norm()).item() < 0.1
