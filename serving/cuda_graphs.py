"""CUDA-graph capture sizes and mode for the engine, decided by the launcher (option.cuda_graph_max_tokens,
option.cuda_graph_full_steps).

vLLM captures graphs for steps of up to 2 x max_num_seqs tokens, at most 512 on Hopper, and runs every larger step,
such as one that prefills a few prompts at once, eagerly, paying each layer's launches on the host. Above vLLM's own
sizes this module adds sizes a quarter of a power of two apart (above 512: 640, 768, 896, 1024, 1280, ..., up to
cuda_graph_max_tokens), so a step is padded by less than 25%, and hands the list to vLLM as its compilation
config's `cudagraph_capture_sizes`. vLLM pads a step up to the next captured size, replays the graph, and counts the
graphs' memory before it sizes the KV cache.

cuda_graph_full_steps asks vLLM for cudagraph_mode FULL: every step up to the largest size in one graph, attention
and the KV-cache write included, where vLLM's FULL_AND_PIECEWISE runs a step with prompt tokens piecewise, attention
eager between the graph pieces of each layer. A backend that captures only uniform decode batches (FlashInfer, the
MLA backends) keeps FULL_AND_PIECEWISE, one that captures none PIECEWISE (patch 0013), each with vLLM's warning in
the start log. Neither is applied where the user's compilation config or flags decide the graphs themselves. The
measurements behind both defaults: docs/settings.md.
"""
from __future__ import annotations

from typing import Mapping

from .settings import flag_set

SETTING = "cuda_graph_max_tokens"
FULL_STEPS_SETTING = "cuda_graph_full_steps"
MODE_KEY = "cudagraph_mode"  # vLLM's CompilationConfig field
# vLLM 0.32's own sizes (VllmConfig._set_cudagraph_sizes): 1, 2, 4, multiples of 8 below 256, then multiples of 16
# up to 2 x max_num_seqs, at most 512; its default max_num_seqs on a Hopper API server gives the 512.
VLLM_MAX_DEFAULT_SIZE = 512
# Keys of vLLM's compilation config that size the graphs themselves: a user who sets one keeps it.
USER_SIZE_KEYS = ("cudagraph_capture_sizes", "max_cudagraph_capture_size")


def vllm_default_sizes(max_num_seqs: int | None) -> list[int]:
    top = VLLM_MAX_DEFAULT_SIZE if max_num_seqs is None else min(2 * max_num_seqs, VLLM_MAX_DEFAULT_SIZE)
    sizes = [n for n in (1, 2, 4) if n <= top] + list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    if max_num_seqs is not None and max_num_seqs <= top:
        sizes.append(max_num_seqs)  # vLLM captures the widest decode step too, when it is off the stride
    return sorted(set(sizes))


def capture_sizes(max_tokens: int, max_num_seqs: int | None = None) -> list[int]:
    """vLLM's own sizes, then every p + k * p / 4 (k = 1..4, p a power of two from the largest at or below vLLM's
    own largest size) up to max_tokens, and max_tokens itself: the largest step captured is max_tokens."""
    own = vllm_default_sizes(max_num_seqs)
    sizes = [n for n in own if n <= max_tokens]
    p = 1 << (own[-1].bit_length() - 1)
    while p < max_tokens:
        sizes += [p + k * p // 4 for k in range(1, 5) if p + k * p // 4 <= max_tokens]
        p *= 2
    sizes.append(max_tokens)
    return sorted(set(sizes))


def config_source(entries: Mapping) -> str:
    """The user's compilation_config as a start-log note names it: with where it was set, if it was."""
    user = entries.get("compilation_config")
    return f"compilation_config ({user.source})" if user is not None else "compilation_config"


def _no_graphs(said: str, cpu_build: bool, eager: bool) -> str | None:
    """The note saying why a CUDA-graph setting is left alone on the CPU build or with enforce_eager, else None."""
    if cpu_build:
        return f"{said} ignored: the CPU build runs no CUDA graphs"
    if eager:
        return f"{said} ignored: enforce_eager runs no CUDA graphs"
    return None


def compilation_config(max_tokens: int, config: dict | None, entries: Mapping, cpu_build: bool,
                       eager: bool) -> tuple[dict | None, str | None]:
    """The compilation config to hand vLLM for `max_tokens`: `config` (the user's, {} if unset; None where it is no
    JSON object, which vLLM's parser refuses) with the sizes added, or None to leave it as it is; and a note for the
    start log saying what was done, or why not. `entries` are the launcher's resolved settings; `eager`: the user set
    enforce_eager."""
    if not max_tokens or config is None:
        return None, None
    if note := _no_graphs(f"{SETTING}={max_tokens}", cpu_build, eager):
        return None, note
    given = [k for k in USER_SIZE_KEYS if k in config]
    if given:
        return None, f"{SETTING}={max_tokens} ignored: {config_source(entries)} sets {given[0]}"
    if str(config.get(MODE_KEY, "")).upper() == "NONE":
        return None, f"{SETTING}={max_tokens} ignored: {config_source(entries)} sets {MODE_KEY} NONE"
    batched = entries.get("max_num_batched_tokens")
    if batched is not None and batched.value and int(batched.value) < max_tokens:
        max_tokens = int(batched.value)  # vLLM never runs a larger step, and drops larger sizes with a warning
    seqs = entries.get("max_num_seqs")
    max_num_seqs = int(seqs.value) if seqs is not None and seqs.value else None
    if max_tokens <= vllm_default_sizes(max_num_seqs)[-1]:
        return None, None  # vLLM's own sizes already reach every step
    sizes = capture_sizes(max_tokens, max_num_seqs)
    above = [n for n in sizes if n > VLLM_MAX_DEFAULT_SIZE]
    return {**config, "cudagraph_capture_sizes": sizes}, (f"CUDA graphs for steps of up to {max_tokens} tokens ({SETTING}): "
                                f"{len(sizes)} capture sizes, {len(above)} of them above vLLM's 512")


def full_steps_config(enabled: bool, config: dict | None, entries: Mapping, cpu_build: bool,
                      eager: bool) -> tuple[dict | None, str | None]:
    """option.cuda_graph_full_steps as compilation_config does for the sizes: `config` with cudagraph_mode FULL, or
    None to leave it as it is; and a note for the start log saying what was done, or why not."""
    if not enabled or config is None:
        return None, None
    said = f"{FULL_STEPS_SETTING}=true"
    if note := _no_graphs(said, cpu_build, eager):
        return None, note
    source = config_source(entries)
    if MODE_KEY in config:
        return None, f"{said} ignored: {source} sets {MODE_KEY} {config[MODE_KEY]}"
    # Only vLLM's own compilation splits the graph at attention, which the fallback of a backend that runs no step
    # in a full graph needs (patch 0013); under any other mode vLLM keeps its own choice.
    mode = config.get("mode")
    if mode is not None and str(mode).strip().upper() not in ("3", "VLLM_COMPILE"):
        return None, f"{said} ignored: {source} sets mode {mode}"
    level = entries.get("optimization_level")
    if level is not None and str(level.value).strip() == "0":
        return None, f"{said} ignored: optimization_level 0 ({level.source}) runs no CUDA graphs"
    # A KV connector decides the mode with vLLM: some need piecewise graphs, vLLM 0.32's HiSparse refuses FULL.
    connector = entries.get("kv_transfer_config")
    if connector is not None and str(connector.value).strip():
        return None, f"{said} ignored: kv_transfer_config ({connector.source}) sets a KV connector"
    # With LoRA vLLM captures every graph once per count of active adapters it specializes on, and a full graph of a
    # prompt step holds more memory than its pieces: that trade is unmeasured, so LoRA keeps vLLM's mode.
    lora = entries.get("enable_lora")
    if lora is not None and flag_set(lora.raw):
        return None, (f"{said} ignored: enable_lora ({lora.source}): vLLM would capture each full graph once per "
                      f"count of active adapters")
    return {**config, MODE_KEY: "FULL"}, (
        f"CUDA graphs: each step in one graph, attention included, steps with prompt tokens too ({FULL_STEPS_SETTING}: "
        f"compilation {MODE_KEY} FULL; an attention backend that cannot keeps vLLM's own mode, with vLLM's warning)")
