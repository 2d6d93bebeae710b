"""Patch 0009 (programmatic dependent launch for the fused-MoE Triton kernel), in the venv's patched vLLM.

What runs here: the switch's values, the launch arguments on this machine (no CUDA: vLLM's launch whatever the
switch says), and the rule that makes PDL safe, read from the patched source: the kernel's wait for the previous
kernel comes before anything else, so no load can see memory the previous kernel is still writing. The launch
itself (Triton's launch_pdl on an H200) is measured by the engine bench's image-pdl arm, not here.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from vllm.model_executor.layers.fused_moe import fused_moe

@pytest.fixture
def switch(monkeypatch):
    def set_to(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv(fused_moe.LMI_FUSED_MOE_PDL_ENV, raising=False)
        else:
            monkeypatch.setenv(fused_moe.LMI_FUSED_MOE_PDL_ENV, value)
        fused_moe._lmi_fused_moe_pdl.cache_clear()
    yield set_to
    fused_moe._lmi_fused_moe_pdl.cache_clear()


@pytest.mark.parametrize("value", [None, "", "0", "off", "false"])
def test_unset_or_off_is_vllms_launch(switch, value):
    switch(value)
    assert fused_moe._lmi_fused_moe_pdl() is False and fused_moe._pdl_launch() == {}


def test_on_without_a_gpu_that_has_pdl_is_vllms_launch(switch):
    switch("1")  # this machine: no CUDA
    assert fused_moe._lmi_fused_moe_pdl() is False and fused_moe._pdl_launch() == {}


def test_a_value_not_understood_is_an_error_naming_it(switch):
    switch("maybe")
    with pytest.raises(ValueError, match="LMI_FUSED_MOE_PDL='maybe' is not understood; allowed:"):
        fused_moe._lmi_fused_moe_pdl()


def test_the_kernel_waits_for_the_previous_one_before_anything_else():
    """With USE_PDL the first statement of fused_moe_kernel (after its docstring) is the wait; its launch passes the
    kernel's USE_PDL and Triton's launch_pdl together (_pdl_launch); patch 0004's split-K kernel keeps the plain
    launch."""
    source = Path(fused_moe.__file__).read_text()
    tree = ast.parse(source)
    fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    kernel = fns["fused_moe_kernel"]
    body = kernel.body[1:] if isinstance(kernel.body[0], ast.Expr) and isinstance(kernel.body[0].value, ast.Constant) \
        else kernel.body
    assert ast.unparse(body[0]) == "if USE_PDL:\n    tl.extra.cuda.gdc_wait()"
    assert kernel.args.args[-1].arg == "USE_PDL" and ast.unparse(kernel.args.defaults[-1]) == "False"
    assert "USE_PDL" not in {a.arg for a in fns["fused_moe_kernel_split_k"].args.args}
    assert source.count("**_pdl_launch(),") == 1  # fused_moe_kernel's launch only
    assert ast.unparse(ast.parse('{"USE_PDL": True, "launch_pdl": True}').body[0].value) in ast.unparse(
        fns["_pdl_launch"])
