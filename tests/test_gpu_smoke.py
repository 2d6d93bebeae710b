"""GPU smoke test: a per-tensor FP8 tiny Qwen3-MoE served with tensor parallelism over every visible GPU.

`make smoke` runs it with SMOKE_REQUIRE_GPU=1: then a GPU stack that does not import, or sees no
GPU, fails the run and names what is missing. Without it (a plain `pytest -m gpu`) the suite is
skipped where there is no GPU. It checks what the CPU suite cannot: FP8 MoE with TP loads and
answers through the patched routing, the warm-up covers every batch size (no Triton compile while
serving 1 to 256 concurrent requests), and no kernel is compiled at start outside vLLM's warm-up.
"""
from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import start_launcher, stop

pytestmark = pytest.mark.gpu

REQUIRE_GPU = os.environ.get("SMOKE_REQUIRE_GPU", "") not in ("", "0")
SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# vLLM's JIT monitor (vllm/utils/jit_monitor.py) logs this for a Triton compile after warm-up.
JIT_WARNING = "JIT compilation during inference"


def gpu_stack() -> tuple[int, str]:
    """(visible GPUs, why there are none): what the smoke test needs, imported as the server will."""
    try:
        import torch
    except Exception as e:  # a broken install raises more than ImportError (undefined symbols: OSError)
        return 0, f"import torch failed: {type(e).__name__}: {e}"
    if not torch.cuda.is_available():
        return 0, (f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none: a CPU build'}) sees no CUDA GPU "
                   f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    try:
        import vllm  # noqa: F401
    except Exception as e:
        return 0, f"import vllm failed: {type(e).__name__}: {e}"
    return torch.cuda.device_count(), ""


def need_gpus() -> int:
    n, why = gpu_stack()
    if n < 1:
        if REQUIRE_GPU:
            pytest.fail(f"SMOKE_REQUIRE_GPU=1 but the GPU stack is not usable: {why}", pytrace=False)
        pytest.skip(why)
    return n


@pytest.fixture(scope="module")
def fp8_server(tmp_path_factory):
    n = need_gpus()
    from serving.tiny_model import TinySpec, make

    model = make(tmp_path_factory.mktemp("fp8") / "tiny-fp8", TinySpec(
        layers=2, hidden=512, heads=8, kv_heads=8, head_dim=64, experts=16, top_k=4, moe_intermediate=1024,
        vocab=512, fp8=True))
    triton_cache = tmp_path_factory.mktemp("triton-cache")  # fresh: every compile of this run lands here
    t0 = time.monotonic()
    srv = start_launcher(tmp_path_factory.mktemp("srv"), {
        "OPTION_MODEL_ID": str(model), "OPTION_TENSOR_PARALLEL_DEGREE": str(n),
        "OPTION_MAX_MODEL_LEN": "1024", "OPTION_MAX_NUM_SEQS": str(max(SWEEP)),
        "OPTION_GPU_MEMORY_UTILIZATION": os.environ.get("SMOKE_GPU_MEM", "0.3"),
        "TRITON_CACHE_DIR": str(triton_cache),
    })
    srv.ready_s = time.monotonic() - t0
    srv.triton_cache = triton_cache
    srv.tp = n
    yield srv
    stop(srv.proc)


def _post(url, body, timeout=300):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _cache_entries(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def test_fp8_moe_tp_serves_lmi_and_openai_bodies(fp8_server):
    print(f"TP={fp8_server.tp}; start to first /ping 200: {fp8_server.ready_s:.0f} s")
    a = _post(fp8_server.url + "/invocations", {"inputs": "Hello", "parameters": {"max_new_tokens": 16,
                                                                                  "do_sample": False}})
    b = _post(fp8_server.url + "/invocations", {"inputs": "Hello", "parameters": {"max_new_tokens": 16,
                                                                                  "do_sample": False}})
    assert len(a["generated_text"]) == 16 and a == b  # greedy is deterministic across TP ranks
    c = _post(fp8_server.url + "/invocations", {"prompt": "Hello", "max_tokens": 8})
    assert c["usage"]["completion_tokens"] == 8


def test_patched_routing_picked_triton_on_hopper(fp8_server):
    import torch

    log = fp8_server.log()
    assert "vLLM patches applied to 0.32.0" in log
    for line in log.splitlines():
        if re.search(r"Fp8 MoE backend|TRITON preferred|Warming up the fused-MoE|FlashInfer", line):
            print(line[-300:])
    if torch.cuda.get_device_capability() == (9, 0):
        assert "Using TRITON Fp8 MoE backend" in log or "TRITON preferred" in log, log[-3000:]


def test_no_kernel_compiled_at_start_outside_warmup(fp8_server):
    """No FlashInfer JIT module is built at start (the image's sampler setting), so a fresh host needs no nvcc."""
    log = fp8_server.log()
    built = [ln for ln in log.splitlines() if "Building JIT module" in ln]
    assert not built, "FlashInfer compiled at start:\n" + "\n".join(built)


def test_concurrency_sweep_compiles_nothing(fp8_server):
    """After warm-up, 1 to 256 concurrent requests: no JIT warning from vLLM and no new Triton cache entry."""
    _post(fp8_server.url + "/invocations", {"inputs": "warm", "parameters": {"max_new_tokens": 4}})
    before_log = fp8_server.log().count(JIT_WARNING)
    before_cache = _cache_entries(fp8_server.triton_cache)
    body = {"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 24, "do_sample": False,
                                                            "ignore_eos_token": True}}
    for n in SWEEP:
        with ThreadPoolExecutor(n) as pool:
            answers = list(pool.map(lambda _: _post(fp8_server.url + "/invocations", body), range(n)))
        assert all(len(a["generated_text"]) == 24 for a in answers), n
    time.sleep(2)  # the engine's log lines reach the file
    jit = fp8_server.log().count(JIT_WARNING) - before_log
    new_entries = sorted(_cache_entries(fp8_server.triton_cache) - before_cache)
    print(f"sweep {SWEEP}: {jit} JIT warnings, {len(new_entries)} new Triton cache entries")
    assert jit == 0, [ln for ln in fp8_server.log().splitlines() if JIT_WARNING in ln]
    assert not new_entries, new_entries[:20]


def test_the_engine_reads_tuned_files_named_for_this_gpu(fp8_server):
    """vLLM finds a fused-MoE file, and patch 0010 a small-M file, by the GPU's name: on a GPU that reads another's
    files (an H100 80GB HBM3 the H200's) the folder handed to the engine holds them under this GPU's name, and the
    start log says so."""
    from serving import tuned_configs
    from serving.paths import CONFIGS_DIR

    device = tuned_configs.gpu_name()
    log = fp8_server.log()
    folder = Path(re.search(r"env VLLM_TUNED_CONFIG_FOLDER=(\S+)", log)[1])
    print(f"GPU {device}; tuned folder {folder}")
    if device in tuned_configs.READS_FILES_OF:
        assert f"tuned configs: the {device} reads" in log, log[-3000:]
        assert list(folder.glob(f"N=*,device_name={device},*small_m.json")), (device, folder)
    if device in (*tuned_configs.READS_FILES_OF, *tuned_configs.devices_in(CONFIGS_DIR)):
        assert list(folder.glob(f"E=*,device_name={device},*.json")), (device, folder)
