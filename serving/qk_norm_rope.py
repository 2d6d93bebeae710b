"""vLLM's fused Q/K RMSNorm + RoPE kernel in place of the one torch.compile generates (option.qk_norm_rope_fusion),
set by the launcher through the compilation config.

Qwen3 and Qwen3-MoE normalize each query and key head and then rotate them, before attention. Without vLLM's
`enable_qk_norm_rope_fusion` pass (off in vLLM 0.32's defaults), torch.compile generates that step as one Triton
reduction kernel a layer, and Inductor's autotuner picks its block sizes once a start, by timing each candidate at
the first call (the profile run's 8,192 tokens). That pick then serves every decode step, and it is not stable: the
compile caches of the engine bench's runs 16-18 hold five different picks for this kernel (bench/e2e/servers.py
inductor_picks), which take 1.6 to 4.3 µs at one token on the H200 (bench/RESULTS-archive.md, run 18): up to 0.25 ms
of a 94-layer one-token step. With the pass vLLM runs its own CUDA kernel, `fused_qk_norm_rope`, which has no
autotuned choice.

Off by default until the engine bench measures it (arm `image-qk-norm-rope`). Not applied on the CPU build (no such
kernel), with enforce_eager (nothing is compiled), or where the user's compilation_config sets the pass itself.
"""
from __future__ import annotations

from typing import Mapping

SETTING = "qk_norm_rope_fusion"
PASS = "enable_qk_norm_rope_fusion"  # vLLM's PassConfig field


def compilation_config(enabled: bool, config: dict | None, entries: Mapping, cpu_build: bool,
                       eager: bool) -> tuple[dict | None, str | None]:
    """`config` (the compilation config the launcher hands vLLM so far: the user's, {} if unset; None where it is no
    JSON object, which vLLM's parser refuses) with vLLM's pass on, or None to leave it as it is; and a note for the
    start log saying what was done, or why not. `entries` are the launcher's resolved settings; `eager`: the user set
    enforce_eager."""
    if not enabled or config is None:
        return None, None
    if cpu_build:
        return None, f"{SETTING}=true ignored: the CPU build has no fused_qk_norm_rope kernel"
    if eager:
        return None, f"{SETTING}=true ignored: enforce_eager compiles nothing"
    user = entries.get("compilation_config")
    source = f"compilation_config ({user.source})" if user is not None else "compilation_config"
    passes = config.get("pass_config", {})
    if not isinstance(passes, dict):
        return None, f"{SETTING}=true ignored: {source} has a pass_config that is no JSON object to add {PASS} to"
    if PASS in passes:
        return None, f"{SETTING}=true ignored: {source} sets pass_config.{PASS}"
    return {**config, "pass_config": {**passes, PASS: True}}, (
        f"vLLM's fused Q/K RMSNorm + RoPE kernel ({SETTING}): compilation pass_config.{PASS} on")
