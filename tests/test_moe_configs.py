"""The tuned fused-MoE config files in configs/ (shipped through
VLLM_TUNED_CONFIG_FOLDER) parse as vLLM 0.32 expects, and load through the
H200 harness's copy of vLLM's lookup (and through vLLM's own, where the
installed vLLM is importable). CPU only; no GPU needed."""
from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

from bench.kernels.moe.configs import entry_str, get_default_config, try_get_config
from bench.kernels.moe.shapes import SHAPES, gemm_dims, vllm_warmup_ms
from serving.vllm_patches.moe_configs import config_file_name, gemm_config, get_moe_configs

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"

NAME_RE = re.compile(
    r"^E=(\d+),N=(\d+),device_name=NVIDIA_H200,dtype=fp8_w8a8(?:,block_shape=\[(\d+),(\d+)\])?\.json$"
)
REQUIRED = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"}
# vLLM's tuner (benchmarks/kernels/benchmark_moe.py) batch sizes up to 4096
TUNER_MS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
H100_SMEM = 227 * 1024  # bytes of shared memory a Hopper CTA can use
# what patch 0003 lets a per-GEMM dict set (vLLM's MOE_GEMM_KEYS once patched)
PER_GEMM_KEYS = {"BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages", "SWAP_AB", "SPLIT_K", "GEMV"}

FILES = sorted(p for p in CONFIGS.glob("E=*.json"))  # the fused-MoE files; the small-M linear files: test_block_fp8_small_m.py


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
    assert config_file_name(E, N, block) == path.name
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    data.pop("triton_version", None)  # vLLM's get_moe_configs drops it too
    keys = [int(k) for k in data]  # vLLM does int(key): must not raise
    assert all(k > 0 for k in keys)
    assert sorted(keys) == keys, "keys out of order (harmless for vLLM, but the tuner writes them sorted)"
    assert set(TUNER_MS) <= set(keys), "every tuner token count must have an entry"
    for k, entry in data.items():
        # patch 0003: optional per-GEMM dicts override the flat keys (never BLOCK_SIZE_M)
        assert set(entry) - {"w13", "w2"} == REQUIRED, f"M={k}: keys {sorted(entry)}"
        for gemm in ("w13", "w2"):
            sub = entry.get(gemm, {})
            assert set(sub) <= PER_GEMM_KEYS, f"M={k} {gemm}: {sorted(sub)}"
            cfg = gemm_config(entry, gemm)
            _check_gemm_config(f"M={k} {gemm}", cfg, block)
            if "GEMV" in cfg:
                # patch 0011's own check, from the installed vLLM, at this GEMM's N and K
                assert block == [128, 128], f"M={k} {gemm}: a GEMV dict needs [128, 128] blocks"
                shape = next(s for s in SHAPES.values() if (s["E"], s["N"], s["block"]) == (E, N, block))
                _fused_moe().lmi_check_gemv_config(cfg["GEMV"], *gemm_dims(shape, gemm))


def _fused_moe():
    return importlib.import_module("vllm.model_executor.layers.fused_moe.fused_moe")


def _check_gemm_config(where, cfg, block):
    assert all(isinstance(cfg[key], int) and not isinstance(cfg[key], bool) for key in REQUIRED), f"{where}: {cfg}"
    bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
    if block is not None:
        # vLLM runs a block-quantized GEMM at BLOCK_SIZE_K = min(entry, block) (invoke_fused_moe_kernel), so a
        # stock entry kept as the stock choice (BLOCK_SIZE_K 256 at block 128) runs one block a K tile
        bk = min(bk, *block)
    for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
        assert _pow2(cfg[name]), f"{where}: {name}={cfg[name]} is not a power of 2"
    assert 8 <= bm <= 256 and 16 <= bn <= 256 and 16 <= bk <= 512, f"{where}: {cfg}"
    assert cfg["GROUP_SIZE_M"] >= 1
    assert cfg["num_warps"] in (1, 2, 4, 8, 16)
    assert 1 <= cfg["num_stages"] <= 8
    # fp8 operands: one byte an element; A tile + B tile per pipeline stage
    assert (bm * bk + bk * bn) * cfg["num_stages"] <= H100_SMEM, f"{where}: {cfg} needs too much smem"
    if block is not None:
        # the kernel loads ONE block scale per K tile: BLOCK_SIZE_K must tile a quant block
        assert bk <= block[1] and block[1] % bk == 0, f"{where}: BLOCK_SIZE_K={bk} vs block {block}"
    if "SWAP_AB" in cfg:
        assert isinstance(cfg["SWAP_AB"], bool), f"{where}: SWAP_AB={cfg['SWAP_AB']!r}"
    if "SPLIT_K" in cfg:
        assert cfg["SPLIT_K"] in (2, 4, 8), f"{where}: SPLIT_K={cfg['SPLIT_K']} (patch 0004 tunes 2, 4, 8)"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_config_is_a_target_shape(path):
    m = NAME_RE.match(path.name)
    E, N = int(m.group(1)), int(m.group(2))
    block = [int(m.group(3)), int(m.group(4))] if m.group(3) else None
    shapes = [s for s in SHAPES.values() if (s["E"], s["N"], s["block"]) == (E, N, block)]
    assert shapes, f"{path.name} is no target shape of the harness"


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_harness_lookup(name, tmp_path):
    """The harness's copy of get_moe_configs / try_get_optimal_moe_config finds our
    file first (VLLM_TUNED_CONFIG_FOLDER precedes vLLM's own configs/) and picks
    the nearest key, as vLLM does."""
    sh = SHAPES[name]
    fname = config_file_name(sh["E"], sh["N"], sh["block"])
    if not (CONFIGS / fname).exists():
        pytest.skip(f"no tuned file for {name} (stock file kept)")
    ours = json.loads((CONFIGS / fname).read_text())
    ours.pop("triton_version", None)
    # a decoy 'stock' folder with a different file of the same name must lose
    (tmp_path / fname).write_text(json.dumps({"1": dict.fromkeys(REQUIRED, 1)}))
    cfgs, path = get_moe_configs(sh["E"], sh["N"], sh["block"], [str(CONFIGS), str(tmp_path)])
    assert Path(path).parent == CONFIGS
    assert cfgs == {int(k): v for k, v in ours.items()}
    for M in (1, 3, 5, 20, 100, 700, 5000, 8192):
        cfg, src = try_get_config(sh, M, [str(CONFIGS)])
        key = min(cfgs, key=lambda x: abs(x - M))
        assert cfg == cfgs[key] and src.endswith(f"[{key}]")


def test_default_config_matches_vllm_rules():
    """Spot checks of the harness's get_default_config against vLLM 0.32's CUDA branch."""
    d = get_default_config(1, 128, 192, 4096, 8, "fp8_w8a8", None)
    assert d == {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                 "num_warps": 4, "num_stages": 4}
    d = get_default_config(4096, 128, 192, 4096, 8, "fp8_w8a8", None)
    assert d["BLOCK_SIZE_M"] == 128 and d["num_warps"] == 8 and d["GROUP_SIZE_M"] == 1
    assert get_default_config(4096, 8, 1792, 4096, 2, "fp8_w8a8", None)["GROUP_SIZE_M"] == 16
    d = get_default_config(4, 256, 256, 7168, 8, "fp8_w8a8", [128, 128])
    assert d["BLOCK_SIZE_N"] == 64 and d["num_stages"] == 4 and d["BLOCK_SIZE_K"] == 128


def test_moe_align_block_size_torch():
    torch = pytest.importorskip("torch")
    from bench.kernels.moe.launch import moe_align_block_size_torch
    g = torch.Generator().manual_seed(0)
    for M, E, topk, bm in [(1, 8, 2, 16), (5, 16, 4, 16), (37, 128, 8, 32), (300, 8, 2, 64)]:
        ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)]).to(torch.int32)
        sorted_ids, expert_ids, ntpp = moe_align_block_size_torch(ids, bm, E)
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


def _read_configs_from(monkeypatch, fm, folder: Path) -> None:
    """Make the installed vLLM's fused_moe read tuned files from `folder` as on an H200."""
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(folder))
    monkeypatch.setattr(fm, "get_device_name_as_file_name", lambda: "NVIDIA_H200")
    fm.get_moe_configs.cache_clear()


def test_vllm_own_lookup(monkeypatch):
    """Where the installed (CPU) vLLM is importable, its own get_moe_configs reads
    our files through VLLM_TUNED_CONFIG_FOLDER (device name forced to H200)."""
    try:
        fm = importlib.import_module("vllm.model_executor.layers.fused_moe.fused_moe")
    except Exception as ex:  # noqa: BLE001
        pytest.skip(f"vLLM not importable here: {ex!r}")
    _read_configs_from(monkeypatch, fm, CONFIGS)
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
    for sh in SHAPES.values():
        for M in list(range(1, 130)) + [255, 256, 511, 512, 513, 1024, 4096, 8192]:
            theirs = dict(fm.get_default_config(M, sh["E"], sh["N"], sh["H"], sh["topk"], "fp8_w8a8", sh["block"]))
            theirs.pop("SPLIT_K", None)
            assert get_default_config(M, sh["E"], sh["N"], sh["H"], sh["topk"], "fp8_w8a8", sh["block"]) == theirs


def _patched_vllm_fused_moe():
    try:
        fm = importlib.import_module("vllm.model_executor.layers.fused_moe.fused_moe")
    except Exception as ex:  # noqa: BLE001
        pytest.skip(f"vLLM not importable here: {ex!r}")
    if not hasattr(fm, "try_get_optimal_moe_gemm_configs"):
        pytest.fail("the installed vLLM lacks patch 0003 (run `python -m serving.vllm_patches apply`)")
    return fm


def test_vllm_per_gemm_lookup(monkeypatch):
    """Patch 0003 in the installed vLLM: the (w13, w2) pair it resolves from our
    files is the harness's (what the H200 measured); other callers get the
    flat entry."""
    fm = _patched_vllm_fused_moe()
    _read_configs_from(monkeypatch, fm, CONFIGS)
    seen_split_k = False
    for name, sh in SHAPES.items():
        w1 = (sh["E"], 2 * sh["N"], sh["H"])
        w2 = (sh["E"], sh["H"], sh["N"])
        for M in (1, 2, 3, 24, 100, 5000):
            got13, got2 = fm.try_get_optimal_moe_gemm_configs(w1, w2, sh["topk"], "fp8_w8a8", M, sh["block"])
            entry, _ = try_get_config(sh, M, [str(CONFIGS), str(Path(fm.__file__).parent / "configs")])
            assert (got13, got2) == (gemm_config(entry, "w13"), gemm_config(entry, "w2")), (name, M)
            assert got13["BLOCK_SIZE_M"] == got2["BLOCK_SIZE_M"]
            flat = fm.try_get_optimal_moe_config(w1, w2, sh["topk"], "fp8_w8a8", M, sh["block"])
            assert not {"w13", "w2"} & set(flat), (name, M, flat)
            seen_split_k |= got13.get("SPLIT_K", 1) > 1
    assert seen_split_k, "no shipped entry uses patch 0004's split-K kernel"


@pytest.mark.parametrize("entry, message", [
    ({"w2": {"BLOCK_SIZE_M": 32}}, "'w2' sets ['BLOCK_SIZE_M']; allowed:"),
    ({"SWAP_AB": False}, "['SWAP_AB'] may be set only inside ['w13', 'w2'] dicts"),
    ({"SPLIT_K": 2}, "['SPLIT_K'] may be set only inside ['w13', 'w2'] dicts"),
    ({"w13": {"SPLIT_K": 0}}, "'w13': SPLIT_K must be a positive integer, got 0"),
    ({"w13": {"num_warps": 4, "tile": 2}}, "'w13' sets ['tile']; allowed:"),
    ({"w13": [1]}, "'w13' must be an object"),
])
def test_vllm_rejects_bad_per_gemm_entries(monkeypatch, tmp_path, entry, message):
    """A bad per-GEMM entry fails at load, naming the file, the entry and what is allowed."""
    fm = _patched_vllm_fused_moe()
    base = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
            "num_warps": 4, "num_stages": 3}
    name = config_file_name(128, 192)
    (tmp_path / name).write_text(json.dumps({"1": base, "8": {**base, **entry}}))
    _read_configs_from(monkeypatch, fm, tmp_path)
    with pytest.raises(ValueError) as ei:
        fm.get_moe_configs(128, 192, "fp8_w8a8", 0, 0)
    fm.get_moe_configs.cache_clear()
    assert str(tmp_path / name) in str(ei.value) and "entry 8:" in str(ei.value)
    assert message in str(ei.value)


def test_vllm_warmup_reaches_every_config(monkeypatch):
    """Patch 0005: vLLM's warm-up sizes plus moe_warmup_token_counts reach every
    (w13 config, w2 config, expert-assignment path) that a batch of 1..8192
    tokens selects from our files, computed here independently through the
    harness's copy of the lookup; and each extra size reaches a new one."""
    fm = _patched_vllm_fused_moe()
    if not hasattr(fm, "moe_warmup_token_counts"):
        pytest.fail("the installed vLLM lacks patch 0005 (run `python -m serving.vllm_patches apply`)")
    _read_configs_from(monkeypatch, fm, CONFIGS)
    monkeypatch.setattr(fm, "_MOE_CONFIG_LOOKUPS", set())
    max_tokens = 8192
    for sh in SHAPES.values():  # the profile run looks every MoE shape up once
        fm.try_get_optimal_moe_config((sh["E"], 2 * sh["N"], sh["H"]), (sh["E"], sh["H"], sh["N"]), sh["topk"],
                                      "fp8_w8a8", max_tokens, sh["block"])
    visited = set(vllm_warmup_ms(max_tokens))
    extra = fm.moe_warmup_token_counts(max_tokens, visited)

    def key(name, sh, m):
        entry, _ = try_get_config(sh, m, [str(CONFIGS)])
        return name, entry_str(entry), m * sh["topk"] * 4 <= sh["E"]

    every = {key(n, sh, m) for n, sh in SHAPES.items() for m in range(1, max_tokens + 1)}
    reached = {key(n, sh, m) for n, sh in SHAPES.items() for m in visited}
    assert reached != every, "vLLM's own warm-up already reaches every config: nothing to test"
    for m in extra:
        new = {key(n, sh, m) for n, sh in SHAPES.items()} - reached
        assert new, f"warm-up size {m} reaches no new config"
        reached |= new
    assert reached == every
    assert 769 in extra or any(512 < m <= 1024 for m in extra)  # key 1024's config (measured compile at 769)
