"""Patch 0007's one-pass softmax top-k routing kernel, as the installed (patched) vLLM ships it, run by Triton's
interpreter on the CPU (tests/moe_one_pass_topk_check.py, in its own process) against the contract of vLLM's
topk_softmax op written in torch: the TP8 shards' routers and two others, three logit dtypes, ties, NaN/Inf
logits, padding rows, int64 ids and the switch. bench/kernels/router_topk.py compares it with vLLM's CUDA op on
the H200."""
from __future__ import annotations

import pytest

from check_script import Check
from conftest import check_fixture


one_pass_topk = check_fixture("one_pass_topk",
                              lambda tmp: Check("moe_one_pass_topk_check.py", triton_interpret=True))


@pytest.fixture(scope="module")
def cases(one_pass_topk):
    return one_pass_topk["cases"]


def compared(cases):
    return {k: v for k, v in cases.items() if isinstance(v, dict) and "ids_equal" in v}


def test_ids_source_rows_and_weights_match_the_op_contract(cases):
    shaped = compared(cases)
    assert len(shaped) == 4 * (3 * 3 + 2) + 4
    bad = {k: v for k, v in shaped.items() if not (v["ids_equal"] and v["src_equal"] and v["max_weight_diff"] < 1e-6)}
    assert not bad, bad


def test_renormalized_weights_sum_to_one_and_ids_keep_their_dtype(cases):
    assert abs(cases["E160 k8 rows1 torch.bfloat16"]["first_weights_sum"] - 1.0) < 1e-6
    assert cases["E128 k8 not renormalized"]["first_weights_sum"] < 1.0
    assert cases["E160 k8 int64 ids"]["ids_dtype"] == "torch.int64"


def test_ties_go_to_the_lower_expert(cases):
    assert cases["all equal E128"]["first_ids"] == list(range(8))


def test_a_nan_or_inf_logit_zeroes_its_row_as_vllms_op_does(cases):
    # rows with NaN or +Inf: experts 0-7, each once (not expert 0 eight times), weight 0 (renormalizing by 1)
    rows = cases["nan and inf rows"]
    for r in range(3):
        assert rows["ids"][r] == list(range(8)) and rows["weights"][r] == [0.0] * 8, r
    # a -Inf logit is an expert of probability 0: the row keeps its softmax, expert 9 is never picked
    assert 9 not in rows["ids"][3] and abs(sum(rows["weights"][3]) - 1.0) < 1e-6
    assert cases["nan and inf"]["ids_equal"]


def test_padding_rows_get_expert_minus_one_and_keep_their_weights(cases):
    # expert -1, which the experts skip; the weights stay as computed (vLLM's op writes none defined there
    # for 160 experts: bench/kernels/router_topk.py)
    assert cases["padding rows"]["ids_equal"]
    assert cases["padding rows values"] == {"ids": [-1], "weights_kept": True}


def test_switch_values(cases):
    assert [cases[f"switch {v!r}"] for v in ("", "1", "on", "0", "off")] == [True, True, True, False, False]
    bad = cases["switch 'maybe'"]
    assert "LMI_MOE_ONE_PASS_TOPK='maybe'" in bad and "allowed:" in bad


def test_limits(cases):
    assert cases["limits"] == {"tokens": 4096, "experts": 1024}
