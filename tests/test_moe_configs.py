"""The tuned fused-MoE config files in configs/ (shipped through
VLLM_TUNED_CONFIG_FOLDER) parse as vLLM 0.32 expects, and load through the
H200 harness's copy of vLLM's lookup (and through vLLM's own, where the
installed vLLM is importable). CPU only; no GPU needed."""
from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
sys.path.insert(0, str(ROOT / "bench"))
mb = importlib.import_module("moe_kernel_bench")

NAME_RE = re.compile(
    r"^E=(\d+),N=(\d+),device_name=NVIDIA_H200,dtype=fp8_w8a8(?:,block_shape=\[(\d+),(\d+)\])?\.json$"
)
REQUIRED = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"}
# vLLM's tuner (benchmarks/kernels/benchmark_moe.py) batch sizes up to 4096
TUNER_MS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
H100_SMEM = 227 * 1024  # bytes of shared memory a Hopper CTA can use

FILES = sorted(p for p in CONFIGS.glob("*.json"))


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def test_configs_exist():
    assert FILES, "configs/ holds no tuned fused-MoE config"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_config_file_format(path):
    m = NAME_RE.match(path.name)
    assert m, f"{path.name}: not a vLLM fused-MoE config name for NVIDIA_H200 fp8_w8a8"
    E, N = int(m.group(1)), int(m.group(2))
    block = [int(m.group(3)), int(m.group(4))] if m.group(3) else None
    # vLLM builds the same name (no spaces in block_shape)
    assert mb.config_file_name(E, N, block) == path.name
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    data.pop("triton_version", None)  # vLLM's get_moe_configs drops it too
    keys = [int(k) for k in data]  # vLLM does int(key): must not raise
    assert all(k > 0 for k in keys)
    assert sorted(keys) == keys, "keys out of order (harmless for vLLM, but the tuner writes them sorted)"
    assert set(TUNER_MS) <= set(keys), "every tuner token count must have an entry"
    for k, cfg in data.items():
        assert set(cfg) == REQUIRED, f"M={k}: keys {sorted(cfg)}"
        assert all(isinstance(v, int) and not isinstance(v, bool) for v in cfg.values()), f"M={k}: {cfg}"
        bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
        for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
            assert _pow2(cfg[name]), f"M={k}: {name}={cfg[name]} is not a power of 2"
        assert 8 <= bm <= 256 and 16 <= bn <= 256 and 16 <= bk <= 512, f"M={k}: {cfg}"
        assert cfg["GROUP_SIZE_M"] >= 1
        assert cfg["num_warps"] in (1, 2, 4, 8, 16)
        assert 1 <= cfg["num_stages"] <= 8
        # fp8 operands: one byte an element; A tile + B tile per pipeline stage
        assert (bm * bk + bk * bn) * cfg["num_stages"] <= H100_SMEM, f"M={k}: {cfg} needs too much smem"
        if block is not None:
            # the kernel loads ONE block scale per K tile: BLOCK_SIZE_K must tile a quant block
            assert bk <= block[1] and block[1] % bk == 0, f"M={k}: BLOCK_SIZE_K={bk} vs block {block}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_config_is_a_target_shape(path):
    m = NAME_RE.match(path.name)
    E, N = int(m.group(1)), int(m.group(2))
    block = [int(m.group(3)), int(m.group(4))] if m.group(3) else None
    shapes = [s for s in mb.SHAPES.values() if (s["E"], s["N"], s["block"]) == (E, N, block)]
    assert shapes, f"{path.name} is no target shape of the harness"


@pytest.mark.parametrize("name", sorted(mb.SHAPES))
def test_harness_lookup(name, tmp_path):
    """The harness's copy of get_moe_configs / try_get_optimal_moe_config finds our
    file first (VLLM_TUNED_CONFIG_FOLDER precedes vLLM's own configs/) and picks
    the nearest key, as vLLM does."""
    sh = mb.SHAPES[name]
    fname = mb.config_file_name(sh["E"], sh["N"], sh["block"])
    if not (CONFIGS / fname).exists():
        pytest.skip(f"no tuned file for {name} (stock file kept)")
    ours = json.loads((CONFIGS / fname).read_text())
    ours.pop("triton_version", None)
    # a decoy 'stock' folder with a different file of the same name must lose
    (tmp_path / fname).write_text(json.dumps({"1": dict.fromkeys(REQUIRED, 1)}))
    cfgs, path = mb.get_moe_configs(sh["E"], sh["N"], sh["block"], [str(CONFIGS), str(tmp_path)])
    assert Path(path).parent == CONFIGS
    assert cfgs == {int(k): v for k, v in ours.items()}
    for M in (1, 3, 5, 20, 100, 700, 5000, 8192):
        cfg, src = mb.try_get_config(sh, M, [str(CONFIGS)])
        key = min(cfgs, key=lambda x: abs(x - M))
        assert cfg == cfgs[key] and src.endswith(f"[{key}]")


def test_default_config_matches_vllm_rules():
    """Spot checks of the harness's get_default_config against vLLM 0.32's CUDA branch."""
    d = mb.get_default_config(1, 128, 192, 4096, 8, "fp8_w8a8", None)
    assert d == {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                 "num_warps": 4, "num_stages": 4}
    d = mb.get_default_config(4096, 128, 192, 4096, 8, "fp8_w8a8", None)
    assert d["BLOCK_SIZE_M"] == 128 and d["num_warps"] == 8 and d["GROUP_SIZE_M"] == 1
    assert mb.get_default_config(4096, 8, 1792, 4096, 2, "fp8_w8a8", None)["GROUP_SIZE_M"] == 16
    d = mb.get_default_config(4, 256, 256, 7168, 8, "fp8_w8a8", [128, 128])
    assert d["BLOCK_SIZE_N"] == 64 and d["num_stages"] == 4 and d["BLOCK_SIZE_K"] == 128


def test_moe_align_block_size_torch():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    for M, E, topk, bm in [(1, 8, 2, 16), (5, 16, 4, 16), (37, 128, 8, 32), (300, 8, 2, 64)]:
        ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)]).to(torch.int32)
        sorted_ids, expert_ids, ntpp = mb.moe_align_block_size_torch(ids, bm, E)
        numel = ids.numel()
        n = int(ntpp.item())
        assert n % bm == 0 and n <= sorted_ids.numel()
        flat = ids.reshape(-1)
        seen = []
        for b in range(n // bm):
            blk = sorted_ids[b * bm:(b + 1) * bm]
            valid = blk[blk < numel]
            assert torch.all(flat[valid.long()] == expert_ids[b])
            seen += valid.tolist()
        assert sorted(seen) == list(range(numel))  # every routed token exactly once
        assert torch.all(sorted_ids[n:] == numel)


def test_vllm_own_lookup(monkeypatch):
    """Where the installed (CPU) vLLM is importable, its own get_moe_configs reads
    our files through VLLM_TUNED_CONFIG_FOLDER (device name forced to H200)."""
    try:
        fm = importlib.import_module("vllm.model_executor.layers.fused_moe.fused_moe")
    except Exception as ex:  # noqa: BLE001
        pytest.skip(f"vLLM not importable here: {ex!r}")
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(CONFIGS))
    monkeypatch.setattr(fm, "get_device_name_as_file_name", lambda: "NVIDIA_H200")
    for path in FILES:
        m = NAME_RE.match(path.name)
        E, N = int(m.group(1)), int(m.group(2))
        bn, bk = (int(m.group(3)), int(m.group(4))) if m.group(3) else (0, 0)
        assert fm.get_config_file_name(E, N, "fp8_w8a8", [bn, bk] if bn else None) == path.name
        fm.get_moe_configs.cache_clear()
        cfgs = fm.get_moe_configs(E, N, "fp8_w8a8", bn, bk)
        ours = json.loads(path.read_text())
        ours.pop("triton_version", None)
        assert cfgs == {int(k): v for k, v in ours.items()}


def test_default_config_equals_vllm(monkeypatch):
    """The harness's get_default_config is vLLM 0.32's (CUDA branch), for every target shape."""
    try:
        fm = importlib.import_module("vllm.model_executor.layers.fused_moe.fused_moe")
    except Exception as ex:  # noqa: BLE001
        pytest.skip(f"vLLM not importable here: {ex!r}")
    monkeypatch.setattr(fm.current_platform, "is_rocm", lambda: False)
    for sh in mb.SHAPES.values():
        for M in list(range(1, 130)) + [255, 256, 511, 512, 513, 1024, 4096, 8192]:
            theirs = dict(fm.get_default_config(M, sh["E"], sh["N"], sh["H"], sh["topk"], "fp8_w8a8", sh["block"]))
            theirs.pop("SPLIT_K", None)
            assert mb.get_default_config(M, sh["E"], sh["N"], sh["H"], sh["topk"], "fp8_w8a8", sh["block"]) == theirs
