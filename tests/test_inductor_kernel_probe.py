"""bench/inductor_kernel_probe.py: a generated kernel from a run's compile cache, rebuilt at decode sizes and
launched under each autotuner config, runs as Inductor ran it (Triton's interpreter on the CPU; the timing is the
GPU's)."""
from __future__ import annotations

import argparse

import pytest

from bench import inductor_kernel_probe as probe
from check_script import Check
from conftest import check_fixture

qk_norm_rope_probe = check_fixture("qk_norm_rope_probe",
                                   lambda tmp: Check("inductor_kernel_probe_check.py", triton_interpret=True))


def test_run_17s_qk_norm_rope_kernel_under_each_config_matches_a_reference(qk_norm_rope_probe):
    r = qk_norm_rope_probe
    assert r["configs_agree"] is True
    assert r["shapes"] == [[3, 1280], [3, 8, 128], [3, 1, 128]] and r["xnumel"] == [24, 3]  # 8 q heads, 1 k head
    assert r["q_err"] < 0.01 * r["q_scale"] and r["k_err"] < 0.01 * r["q_scale"]  # bf16 outputs


def test_inputs_scale_what_is_a_multiple_of_the_compiled_token_count():
    src = ("def get_args():\n"
           "    arg_0 = rand_strided((8192, 1280), (1280, 1), device='cuda:0', dtype=torch.bfloat16)\n"
           "    arg_1 = rand_strided((4096, 128), (128, 1), device='cuda:0', dtype=torch.bfloat16)\n"
           "    arg_2 = rand_strided((8192,), (1,), device='cuda:0', dtype=torch.int64)\n"
           "    return arg_0, arg_1, arg_2, 65536, 8192, 128,")
    a0, a1, a2, n0, n1, r = probe.inputs(src, 8192, 2, "cpu")
    assert list(a0.shape) == [2, 1280] and list(a1.shape) == [4096, 128] and a2.tolist() == [0, 0]
    assert (n0, n1, r) == (16, 2, 128)
    with pytest.raises(ValueError, match="only contiguous inputs"):
        probe.inputs(src.replace("(1280, 1)", "(1, 8192)"), 8192, 2, "cpu")


def test_a_file_with_several_kernels_and_a_bad_config_are_refused(tmp_path):
    f = tmp_path / "k.py"
    f.write_text("@triton.jit\ndef a():\n    pass\n\n@triton.jit\ndef b():\n    pass\n\n\n"
                 "def get_args():\n    return 1,\n")
    with pytest.raises(ValueError, match="not one generated kernel's file"):
        probe.load(f)
    assert probe.parse_config("2,128,2") == (2, 128, 2)
    with pytest.raises(argparse.ArgumentTypeError, match="XBLOCK,R0_BLOCK,num_warps"):
        probe.parse_config("2,128")
