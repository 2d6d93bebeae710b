"""What the bench's host can hold, checked before anything is made or started: the checkpoints on the disk under
--models-dir, and each model's servers, started together, in the GPU's memory (with --kv-pool sized, each server's
--gpu-mem share of it, the shares one after another). A run that cannot fit is refused with
the most layers that would, not minutes into a device lease."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Callable, Mapping

from serving.tiny_model import TinySpec, holds

from .config import Config
from .models import Model
from .shards import checkpoint_bytes, layer_bytes

# What the disk under --models-dir keeps free beyond the checkpoints: the servers' logs, compile caches and profiles
DISK_MARGIN = 2 << 30

# What each server holds on the GPU beyond its weights (the checkpoint's tensors: vLLM's "Model loading took" equals
# the checkpoint's size) and its KV budget: the CUDA context (0.7 GiB), the CUDA graphs (0.3-1.8 GiB with vLLM's
# FULL_AND_PIECEWISE, 3.3 GiB for the 94-layer 235B EP8 shard with every step in one graph, the image's default since
# run 38) and the start's activations (the servers' logs of runs 20, 26 and 38; run 20 ran four 235B EP8 servers of
# 27.5 GiB of weights each in the 139 GiB an H200 has free). A model's first warm-up may ask for more for a moment
# (run 21: FlashInfer's autotune asked for 12 GiB on the Coder EP8 shard), which this does not count: passing this
# check is necessary, not sufficient.
SERVER_GPU_RESERVE = 9 << 29  # 4.5 GiB
# The largest --mem-fraction-static the sized SGLang arm is started with: above it its CUDA graphs and activations
# have under 1% of the free memory left.
SGLANG_MAX_FRACTION = 0.99


def layers_that_fit(spec: TinySpec, room: int) -> int:
    """The most decoder layers of spec's checkpoint that `room` bytes hold (0 if not even its dense first layers and
    one more do)."""
    first, at_first, layer = layer_bytes(spec)
    return (room - at_first) // layer + first if room >= at_first else 0


def disk_shortfall(cfg: Config, models: dict[str, Model]) -> list[str]:
    """The checkpoints to make (models: each by its --models name, at its depth) that the disk under --models-dir
    cannot hold, each with the most layers that would fit. A folder that already holds its model needs nothing; with
    --drop-models a folder is deleted once its servers stop, so the largest checkpoint must fit, otherwise all of
    them together."""
    need = {name: checkpoint_bytes(m.spec) for name, m in models.items()
            if not holds(cfg.models_dir / m.name, m.spec)}
    folder = next(d for d in (cfg.models_dir, *cfg.models_dir.parents) if d.exists())
    free = shutil.disk_usage(folder).free
    problems = []
    for name, size in need.items():
        room = free - DISK_MARGIN - (0 if cfg.drop_models else sum(need.values()) - size)
        if size <= room:
            continue
        spec = models[name].spec
        layer = layer_bytes(spec)[2]
        fit = layers_that_fit(spec, room)
        problems.append(
            f"--models-dir {cfg.models_dir}: {name} at {models[name].layers} layers needs {size / 1e9:.1f} GB for its "
            f"checkpoint ({layer / 1e9:.2f} GB a layer); {free / 1e9:.1f} GB is free there, "
            f"{DISK_MARGIN / 1e9:.1f} GB of it kept for logs and caches"
            + ("" if cfg.drop_models or len(need) == 1 else " and the other models' checkpoints take the rest "
               "(--drop-models keeps one at a time)")
            + f": at most {fit} of its layers fit (--layers {name}={fit})")
    return problems


def kv_bytes_per_token(spec: TinySpec) -> int:
    """Bytes of KV cache one token takes in spec's checkpoint, bf16 as both engines keep it (servers.
    kv_bytes_per_token reads the same from a made checkpoint's config.json)."""
    if spec.arch == "deepseek_v3":
        return spec.layers * (spec.kv_lora_rank + spec.rope_head_dim) * 2
    return 2 * spec.layers * spec.kv_heads * spec.head_dim * 2


def sized_shortfall(cfg: Config, models: dict[str, Model], free: int, total: int) -> list[str]:
    """With --kv-pool sized, each server takes --gpu-mem of the GPU's `total` bytes, its weights, SERVER_GPU_RESERVE
    and its pool within that share; the arms start one at a time, each engine checking at its start that its share
    is free, so all their shares together must fit `free`. A share too small for the weights, the reserve and one
    request of the full context (vLLM's start refuses a pool that holds none) is refused with the layers that fit."""
    problems, share = [], int(cfg.gpu_mem * total)
    for name, m in models.items():
        arms = cfg.most_at_once(m)
        if arms and len(arms) * share > free:
            problems.append(
                f"{name}: its {len(arms)} servers ({', '.join(arms)}) take --gpu-mem {cfg.gpu_mem} of the GPU's "
                f"{total / 2**30:.1f} GiB each ({share / 2**30:.1f} GiB, started one at a time, each engine sizing its "
                f"KV pool in its share): {len(arms) * share / 2**30:.1f} GiB, over the {free / 2**30:.1f} GiB free. "
                f"Give --gpu-mem {free / total / len(arms):.2f} or less, or name fewer --arms")
        weights, context = checkpoint_bytes(m.spec), cfg.max_model_len * kv_bytes_per_token(m.spec)
        if weights + SERVER_GPU_RESERVE + context <= share:
            continue
        first, at_first, layer = layer_bytes(m.spec)
        per_layer = context // m.layers
        room = share - SERVER_GPU_RESERVE - at_first - first * per_layer
        fit = room // (layer + per_layer) + first if room >= 0 else 0
        problems.append(
            f"{name} at {m.layers} layers: --gpu-mem {cfg.gpu_mem} gives each server {share / 2**30:.1f} GiB, less "
            f"than its {weights / 2**30:.1f} GiB of weights, {SERVER_GPU_RESERVE / 2**30:.1f} GiB for its CUDA "
            f"context, graphs and activations, and one request of its {cfg.max_model_len}-token context "
            f"({context / 2**30:.1f} GiB of KV). At most {fit} of its layers fit (--layers {name}={fit}), or give "
            "a larger --gpu-mem")
    return problems


def sglang_sized_args(cfg: Config, read: Callable[[], tuple[int, int] | None] | None = None) -> list[str]:
    """SGLang's memory setting for --kv-pool sized: its --mem-fraction-static is a share of the memory free at its
    start, which it fills with its weights and its KV pool (its CUDA graphs and activations take what is left), so
    the fraction that makes that --gpu-mem of the GPU's total memory is --gpu-mem x total / free, read just before
    it starts (where no GPU answers, --gpu-mem itself). A fraction above SGLANG_MAX_FRACTION leaves its graphs no
    room: ValueError, the arm not started."""
    memory = (read or gpu_memory)()
    fraction = cfg.gpu_mem if memory is None else cfg.gpu_mem * sum(memory) / memory[0]
    if fraction > SGLANG_MAX_FRACTION:
        raise ValueError(f"sglang: --gpu-mem {cfg.gpu_mem} of the GPU is {fraction:.2f} of the memory free at its "
                         f"start, over {SGLANG_MAX_FRACTION}: the arms started before it hold the rest")
    return ["--mem-fraction-static", f"{fraction:.4f}"]


def gpu_shortfall(cfg: Config, models: dict[str, Model], free: int, total: int | None = None) -> list[str]:
    """Each model whose servers (the arms the run has up at once, Config.most_at_once) do not fit `free` bytes of
    GPU memory: each holds the model's weights, the KV budget (--kv-bytes) and SERVER_GPU_RESERVE. With the most
    layers that would fit as many servers. With --kv-pool sized, sized_shortfall's rule on the GPU's `total`
    memory (free where not given)."""
    if cfg.kv_pool == "sized":
        return sized_shortfall(cfg, models, free, total or free)
    problems = []
    per_server = cfg.kv_bytes + SERVER_GPU_RESERVE
    for name, m in models.items():
        arms = cfg.most_at_once(m)
        weights = checkpoint_bytes(m.spec)
        need = len(arms) * (weights + per_server)
        if not arms or need <= free:
            continue
        fit = layers_that_fit(m.spec, free // len(arms) - per_server)
        problems.append(
            f"{name} at {m.layers} layers: its {len(arms)} servers ({', '.join(arms)}) start together, each holding "
            f"{weights / 2**30:.1f} GiB of weights, the {cfg.kv_bytes / 2**30:.1f} GiB KV budget (--kv-bytes) and "
            f"{SERVER_GPU_RESERVE / 2**30:.1f} GiB for its CUDA context, graphs and activations: {need / 2**30:.1f} "
            f"GiB, over the {free / 2**30:.1f} GiB free on the GPU. At most {fit} of its layers fit {len(arms)} "
            f"servers (--layers {name}={fit}), or name fewer --arms")
    return problems


def parse_gpu_memory(smi_output: str) -> tuple[int, int]:
    """The free and used bytes in `nvidia-smi -i N --query-gpu=memory.free,memory.used --format=csv,noheader,nounits`'s
    output (MiB)."""
    free, used = (int(v) << 20 for v in smi_output.split(","))
    return free, used


def gpu_memory(env: Mapping[str, str] = os.environ) -> tuple[int, int] | None:
    """The free and used memory of the GPU the servers start on (vLLM takes the first it sees: CUDA_VISIBLE_DEVICES's
    first, else GPU 0), None where there is no nvidia-smi (the CPU engine's runs)."""
    first = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    try:
        out = subprocess.run(["nvidia-smi", "-i", first, "--query-gpu=memory.free,memory.used",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_gpu_memory(out)


def gpu_problems(cfg: Config, models: dict[str, Model], settle_s: float = 120.0, poll_s: float = 5.0,
                 log: Callable[[str], None] = print,
                 read: Callable[[], tuple[int, int] | None] = gpu_memory) -> list[str]:
    """gpu_shortfall against the GPU's free memory as `read` gives it (none where there is no GPU). A shortfall that
    the GPU would have even empty (its free and used memory together) is refused at once; otherwise the memory is
    read again every poll_s for up to settle_s: what a process that just ended held (the smoke test's server, a
    kernel probe of the same device session) comes back within seconds, and is no reason to refuse the run."""
    deadline = time.monotonic() + settle_s
    while (memory := read()) is not None and (problems := gpu_shortfall(cfg, models, memory[0], sum(memory))):
        if gpu_shortfall(cfg, models, sum(memory), sum(memory)) or time.monotonic() >= deadline:
            return problems
        log(f"{memory[0] / 2**30:.1f} GiB free on the GPU and {memory[1] / 2**30:.1f} GiB in use, too little for the "
            f"run's servers: read again in {poll_s:.0f} s (for up to {settle_s:.0f} s)")
        time.sleep(poll_s)
    return []
