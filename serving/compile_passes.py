"""vLLM compilation passes the launcher switches through the compilation config it hands vLLM: each a setting of
serving/settings.py and a field of vLLM's PassConfig, written only where the setting departs from vLLM's own choice.

- `option.qk_norm_rope_fusion` (off): vLLM's fused Q/K RMSNorm + RoPE kernel (`enable_qk_norm_rope_fusion`, off in
  vLLM 0.32's defaults). Qwen3 and Qwen3-MoE normalize each query and key head and then rotate them, before
  attention; without the pass torch.compile generates that step as one Triton reduction kernel a layer, whose block
  sizes Inductor's autotuner picks once a start, by timing each candidate at the first call (the profile run's 8,192
  tokens). That pick then serves every decode step, and it is not stable: the compile caches of the engine bench's
  runs 16-18 hold five different picks, which take 1.6 to 4.3 µs at one token on the H200 (bench/RESULTS-archive.md,
  run 18). With the pass vLLM runs its own CUDA kernel, `fused_qk_norm_rope`, which has no autotuned choice. Off
  until the engine bench measures it (arm `image-qk-norm-rope`).
- `option.norm_quant_fusion` (vLLM's choice): false turns off vLLM's RMSNorm + FP8 quantization fusion
  (`fuse_norm_quant`), so the norm before a block-FP8 linear layer runs as torch.compile generates it and its
  quantization as vLLM's group-quantization op. With the fusion, one token's norm and quantization before qkv took
  7.6 µs a layer on the Qwen3-Coder EP8 shard (`rms_norm_per_block_quant_kernel`, engine run 22's profile), where the
  generated norm before the MoE took 2.7 and a group quantization 2.1-2.5. Unmeasured in the engine (arm
  `image-unfused-norm-quant`).

Not applied on the CPU build (neither kernel exists there), with enforce_eager (nothing is compiled), or where the
user's compilation_config sets the pass itself; each case leaves a note in the start log.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class PassSwitch:
    setting: str  # serving/settings.py key
    field: str  # vLLM's PassConfig field
    value: bool  # the setting's value that departs from vLLM's choice, written to the field as is
    what: str  # the start log's words for what that value does
    cpu: str  # why the CPU build ignores it


SWITCHES = (
    PassSwitch("qk_norm_rope_fusion", "enable_qk_norm_rope_fusion", True, "vLLM's fused Q/K RMSNorm + RoPE kernel",
               "the CPU build has no fused_qk_norm_rope kernel"),
    PassSwitch("norm_quant_fusion", "fuse_norm_quant", False,
               "RMSNorm and its FP8 quantization as separate kernels",
               "the CPU build runs no FP8 RMSNorm + quantization fusion"),
)
BY_SETTING = {s.setting: s for s in SWITCHES}


def compilation_config(switch: PassSwitch, value: bool, config: dict | None, entries: Mapping, cpu_build: bool,
                       eager: bool) -> tuple[dict | None, str | None]:
    """`config` (the compilation config the launcher hands vLLM so far: the user's, {} if unset; None where it is no
    JSON object, which vLLM's parser refuses) with the switch's pass field set, or None to leave it as it is; and a
    note for the start log saying what was done, or why not. `entries` are the launcher's resolved settings;
    `eager`: the user set enforce_eager."""
    if value != switch.value or config is None:
        return None, None
    said = f"{switch.setting}={str(value).lower()}"
    if cpu_build:
        return None, f"{said} ignored: {switch.cpu}"
    if eager:
        return None, f"{said} ignored: enforce_eager compiles nothing"
    user = entries.get("compilation_config")
    source = f"compilation_config ({user.source})" if user is not None else "compilation_config"
    passes = config.get("pass_config", {})
    if not isinstance(passes, dict):
        return None, f"{said} ignored: {source} has a pass_config that is no JSON object to add {switch.field} to"
    if switch.field in passes:
        return None, f"{said} ignored: {source} sets pass_config.{switch.field}"
    return {**config, "pass_config": {**passes, switch.field: switch.value}}, (
        f"{switch.what} ({switch.setting}): compilation pass_config.{switch.field} {str(switch.value).lower()}")
