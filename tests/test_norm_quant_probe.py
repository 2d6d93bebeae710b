"""bench/norm_quant_probe.py's check, on the CPU: its compiled functions (one fused, and norm and quantization apart)
give the eager functions' values, up to the order compiled kernels sum in. The timing needs the H200."""
from __future__ import annotations

import pytest
import torch

from bench import norm_quant_probe


@pytest.mark.parametrize("variant", ["this size", "every size"])
def test_the_compiled_norm_and_quantization_match_the_eager_ones(variant):
    r = norm_quant_probe.probe(256, 2, torch.device("cpu"), variant, timed=False)
    assert len(r["fused_relerr"]) == 3 and len(r["norm_relerr"]) == 2
    assert max(r["fused_relerr"] + r["norm_relerr"]) < 0.05, r
    assert r["fused_relerr"][2] == 0.0 and r["norm_relerr"][1] == 0.0  # the residual sum is exact in both


def test_one_graph_serves_every_batch_size_without_a_recompile():
    """The "every size" form, as vLLM compiles: traced once at another size, then one token and eight, one graph."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    every_size, options = norm_quant_probe.VARIANTS["every size"]
    c = norm_quant_probe.compiled(norm_quant_probe.rms_norm, every_size, options,
                                  norm_quant_probe.inputs(256, norm_quant_probe.EVERY_SIZE_EXAMPLE, "cpu"))
    for tokens in (1, 8):
        args = norm_quant_probe.inputs(256, tokens, "cpu")
        assert torch.equal(c(*args)[1], norm_quant_probe.rms_norm(*args)[1])
    assert counters["stats"]["unique_graphs"] == 1


def test_group_quant_scales_are_powers_of_two_with_ue8m0():
    y = torch.randn(3, 512, dtype=torch.bfloat16)
    q, s = norm_quant_probe.group_quant(y, ue8m0=True)
    assert s.shape == (3, 4) and torch.equal(torch.exp2(torch.log2(s).round()), s)
    back = (q.float().view(3, 4, 128) * s[..., None]).view(3, 512)
    assert ((back - y.float()).norm() / y.float().norm()).item() < 0.1
