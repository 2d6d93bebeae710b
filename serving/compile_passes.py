"""vLLM compilation passes the launcher changes through the compilation config it hands vLLM, each from a setting of
serving/settings.py, written only where the setting departs from vLLM's own choice.

- `option.qk_norm_rope_fusion` (off): vLLM's fused Q/K RMSNorm + RoPE kernel (`enable_qk_norm_rope_fusion`, off in
  vLLM 0.32's defaults). Without the pass torch.compile generates that step of Qwen3-style attention as one Triton
  reduction kernel a layer, whose block sizes Inductor's autotuner picks once a start, so its speed varies from
  start to start; with it vLLM runs its own CUDA kernel, `fused_qk_norm_rope`, which has no autotuned choice.
- `option.norm_quant` (compiled): the RMSNorm before a block-FP8 linear layer and its FP8 quantization. vLLM's
  `fuse_norm_quant` pass makes them one CUDA kernel, `rms_norm_per_block_quant_kernel`. `compiled` turns the pass
  off and takes vLLM's quantization op in its native form (`custom_ops` `-quant_fp8`, which vLLM otherwise turns on
  for block-FP8 checkpoints), so torch.compile generates both. `separate` turns only the pass off (the norm as
  torch.compile generates it, then vLLM's group-quantization op); `vllm` leaves vLLM's choice. A checkpoint without
  block-FP8 weights runs no fused norm + quantization in vLLM 0.32 under Inductor, so `compiled` changes nothing
  for it.
- `option.compile_decode_tokens` (0): vLLM compiles one graph for every batch size (the batch dimension symbolic),
  whose generated kernels Inductor tunes at a large size hint. `compile_sizes` gives the decode sizes up to this many
  tokens graphs of their own (vLLM's CUDA-graph sizes: 1, 2, 4, 8, ...), at the cost of compile time at start.

Not applied on the CPU build, with enforce_eager (nothing is compiled), or where the user's compilation_config already
makes the choice; each case leaves a note in the start log. `compiled` and `compile_decode_tokens` are also not
applied where Inductor compiles nothing (compilation mode 0, a backend other than inductor, optimization level 0):
vLLM's native quantization would then run as eager PyTorch, and there are no graphs to specialize. The measurements
behind each default: docs/settings.md.
"""
from __future__ import annotations

from typing import Mapping

from serving.cuda_graphs import config_source, vllm_default_sizes

# vLLM's PassConfig fields
QK_NORM_ROPE_PASS = "enable_qk_norm_rope_fusion"
NORM_QUANT_PASS = "fuse_norm_quant"
QUANT_OP = "quant_fp8"  # vLLM's CustomOp name of its FP8 activation quantization


def _not_compiled(said: str, cpu_build: bool, eager: bool, cpu: str) -> str | None:
    """The note saying why a setting is left alone on the CPU build (`cpu`: why there) or with enforce_eager, else
    None."""
    if cpu_build:
        return f"{said} ignored: {cpu}"
    if eager:
        return f"{said} ignored: enforce_eager compiles nothing"
    return None


def _passes(said: str, config: dict, entries: Mapping, cpu_build: bool, eager: bool, cpu: str,
            field: str) -> tuple[dict | None, str | None]:
    """The pass_config to add `field` to, or None and the note saying why it is left alone."""
    if note := _not_compiled(said, cpu_build, eager, cpu):
        return None, note
    passes = config.get("pass_config", {})
    if not isinstance(passes, dict):
        return None, (f"{said} ignored: {config_source(entries)} has a pass_config that is no JSON object to add "
                      f"{field} to")
    if field in passes:
        return None, f"{said} ignored: {config_source(entries)} sets pass_config.{field}"
    return passes, None


def _not_inductor(config: dict, entries: Mapping) -> str | None:
    """Why torch.compile's Inductor generates no kernels under this config, or None where it does."""
    mode, backend = config.get("mode"), config.get("backend")
    if mode is not None and str(mode).strip().upper() in ("0", "NONE"):
        return f"{config_source(entries)} sets mode {mode}: nothing is compiled"
    if backend is not None and backend != "inductor":
        return f"{config_source(entries)} sets backend {backend}: Inductor generates no kernels"
    level = entries.get("optimization_level")
    if level is not None and str(level.value).strip() == "0":
        return f"optimization_level 0 ({level.source}) compiles nothing"
    return None


def qk_norm_rope_config(enabled: bool, config: dict | None, entries: Mapping, cpu_build: bool,
                        eager: bool) -> tuple[dict | None, str | None]:
    """`config` (the compilation config the launcher hands vLLM so far: the user's, {} if unset; None where it is no
    JSON object, which vLLM's parser refuses) with vLLM's Q/K RMSNorm + RoPE pass on, or None to leave it as it is;
    and a note for the start log saying what was done, or why not. `entries` are the launcher's resolved settings;
    `eager`: the user set enforce_eager."""
    if not enabled or config is None:
        return None, None
    passes, note = _passes("qk_norm_rope_fusion=true", config, entries, cpu_build, eager,
                           "the CPU build has no fused_qk_norm_rope kernel", QK_NORM_ROPE_PASS)
    if passes is None:
        return None, note
    return {**config, "pass_config": {**passes, QK_NORM_ROPE_PASS: True}}, (
        f"vLLM's fused Q/K RMSNorm + RoPE kernel (qk_norm_rope_fusion): compilation pass_config.{QK_NORM_ROPE_PASS} on")


def norm_quant_config(choice: str, config: dict | None, entries: Mapping, cpu_build: bool,
                      eager: bool) -> tuple[dict | None, str | None]:
    """option.norm_quant as qk_norm_rope_config does for its pass: `separate` turns vLLM's fuse_norm_quant pass off,
    `compiled` also adds `-quant_fp8` to custom_ops; `vllm` leaves the config as it is."""
    if choice == "vllm" or config is None:
        return None, None
    said = f"norm_quant={choice}"
    passes, note = _passes(said, config, entries, cpu_build, eager, "the CPU build runs no FP8 norm + quantization",
                           NORM_QUANT_PASS)
    if passes is None:
        return None, note
    if choice == "compiled" and (why := _not_inductor(config, entries)):
        return None, f"{said} ignored: {why}"
    out = {**config, "pass_config": {**passes, NORM_QUANT_PASS: False}}
    if choice == "separate":
        return out, (f"RMSNorm and its FP8 quantization as separate kernels (norm_quant=separate): compilation "
                     f"pass_config.{NORM_QUANT_PASS} false")
    ops = config.get("custom_ops", [])
    if not isinstance(ops, list) or any(isinstance(o, str) and o.lstrip("+-") == QUANT_OP for o in ops):
        return None, f"{said} ignored: {config_source(entries)} sets custom_ops for {QUANT_OP}"
    return {**out, "custom_ops": [*ops, f"-{QUANT_OP}"]}, (
        f"RMSNorm and its FP8 quantization as torch.compile generates them (norm_quant=compiled): compilation "
        f"pass_config.{NORM_QUANT_PASS} false, custom_ops -{QUANT_OP}")


COMPILE_SIZES = "compile_sizes"  # vLLM's CompilationConfig field


def compile_sizes_config(max_tokens: int, config: dict | None, entries: Mapping, cpu_build: bool,
                         eager: bool) -> tuple[dict | None, str | None]:
    """option.compile_decode_tokens as the functions above do for theirs: `config` with compile_sizes, vLLM's
    CUDA-graph sizes up to max_tokens, or None to leave it as it is; 0 leaves it."""
    if not max_tokens or config is None:
        return None, None
    said = f"compile_decode_tokens={max_tokens}"
    if note := _not_compiled(said, cpu_build, eager, "the CPU build runs no CUDA graphs of decode sizes"):
        return None, note
    if why := _not_inductor(config, entries):
        return None, f"{said} ignored: {why}"
    if COMPILE_SIZES in config:
        return None, f"{said} ignored: {config_source(entries)} sets {COMPILE_SIZES}"
    sizes = [n for n in vllm_default_sizes(None) if n <= max_tokens]
    return {**config, COMPILE_SIZES: sizes}, (f"torch.compile graphs of their own for decode steps of "
                                              f"{', '.join(map(str, sizes))} tokens ({said}): compilation "
                                              f"{COMPILE_SIZES} {sizes}")
