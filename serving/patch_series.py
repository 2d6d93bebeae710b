"""Apply the project's patch series (patches/series) to an installed vLLM.

    python -m serving.patch_series apply [--target DIR]   # DIR: a vllm package dir
    python -m serving.patch_series check [--target DIR]
    python -m serving.patch_series list [--markdown]

The series is made for one vLLM release (the `vllm-version` line in
patches/series); another release is refused. Each patch is a unified diff with
paths a/vllm/... and b/vllm/..., preceded by a DEP-3 style header whose
`X-Post-Condition` lines the tool checks after applying:

    X-Post-Condition: match vllm/<file> :: <Python regex, re.MULTILINE>
    X-Post-Condition: do-not-specialize <json file in patches/>

A patch whose changes are already present is recognised and skipped, so
`apply` is idempotent. Hunks must match exactly (a shifted position is
accepted only when the context occurs once); nothing is written unless the
whole series and every post-condition succeed in memory. Swap-AB (vllm PR
#36559, upstream since 0.25) is not patched: the tool checks that it is
present and that it fires for decode batch sizes of the H200 FP8 configs in
configs/. The result is recorded in <vllm>/_lmi_patches.json (read_record()).

Exit status: 0 ok; 1 a patch, post-condition or check failed; 2 refused
(wrong vLLM version, no vLLM, bad series or arguments).

Standard library only: it runs in the image build before anything imports
vLLM, and `serving` must stay import-light.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime as _dt
import hashlib
import importlib.util
import json
import os
import py_compile
import re
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PATCHES_DIR = REPO_ROOT / "patches"
DEFAULT_CONFIGS_DIR = REPO_ROOT / "configs"
RECORD_NAME = "_lmi_patches.json"
RECORD_FORMAT = 1
# Decode batch sizes (tokens per MoE call) for which swap-AB must fire.
DEFAULT_DECODE_MAX = 32
# Swap-AB's fused-MoE configs: vLLM maps every H200 variant to this name.
H200_FP8_CONFIG_GLOB = "E=*,N=*,device_name=NVIDIA_H200,dtype=fp8_w8a8*.json"
# Arguments that feed pointer arithmetic keep Triton's divisibility
# specialization (it lets Triton vectorize loads); never list them.
_NEVER_UNSPECIALIZE = re.compile(r"^(stride.*|K|N)$")

EXIT_FAILED = 1
EXIT_REFUSED = 2


class PatchSeriesError(Exception):
    """A failure with the exit status the CLI should return."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.exit_code = exit_code


# --------------------------------------------------------------------------
# Parsing the series and the patches
# --------------------------------------------------------------------------


@dataclasses.dataclass
class Hunk:
    number: int  # 1-based within its file
    old_start: int
    new_start: int
    old: list[str]
    new: list[str]


@dataclasses.dataclass
class FileDiff:
    path: str  # "vllm/..." as in the diff, a/ and b/ stripped
    hunks: list[Hunk]


@dataclasses.dataclass
class Patch:
    name: str
    path: Path
    headers: dict[str, list[str]]
    files: list[FileDiff]
    sha256: str

    def header(self, key: str, default: str = "") -> str:
        values = self.headers.get(key.lower())
        return values[0] if values else default

    @property
    def summary(self) -> str:
        return self.header("Description").splitlines()[0] if self.header(
            "Description"
        ) else ""

    @property
    def post_conditions(self) -> list[str]:
        return self.headers.get("x-post-condition", [])


@dataclasses.dataclass
class Series:
    directory: Path
    vllm_version: str
    patches: list[Patch]


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_REQUIRED_HEADERS = ("Description", "Origin", "Forwarded", "Applied-Upstream",
                     "Last-Update", "X-Post-Condition")


def _strip_prefix(path: str, prefix: str, where: str) -> str:
    path = path.split("\t", 1)[0].strip()
    if not path.startswith(prefix + "vllm/"):
        raise PatchSeriesError(
            f"{where}: diff path {path!r} must start with {prefix}vllm/",
            EXIT_REFUSED,
        )
    return path[len(prefix):]


def parse_patch(path: Path) -> Patch:
    raw = path.read_bytes()
    lines = raw.decode("utf-8").splitlines(keepends=True)
    headers: dict[str, list[str]] = {}
    i = 0
    last_key = None
    # DEP-3 header: "Key: value" lines, continuation lines start with a space;
    # it ends at a line "---" or at the first file header.
    while i < len(lines) and not lines[i].startswith("--- "):
        line = lines[i].rstrip("\n")
        i += 1
        if line == "---":
            break
        if line.startswith((" ", "\t")) and last_key:
            headers[last_key][-1] += "\n" + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            last_key = key.strip().lower()
            headers.setdefault(last_key, []).append(value.strip())
    missing = [k for k in _REQUIRED_HEADERS if k.lower() not in headers]
    if missing:
        raise PatchSeriesError(
            f"patch {path.name}: header lacks {', '.join(missing)}", EXIT_REFUSED
        )

    files: list[FileDiff] = []
    while i < len(lines):
        if not lines[i].startswith("--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchSeriesError(
                f"patch {path.name}: line {i + 1}: '---' without '+++'",
                EXIT_REFUSED,
            )
        old_path = _strip_prefix(lines[i][4:], "a/", f"patch {path.name}")
        new_path = _strip_prefix(lines[i + 1][4:], "b/", f"patch {path.name}")
        if old_path != new_path:
            raise PatchSeriesError(
                f"patch {path.name}: renames are not supported ({old_path})",
                EXIT_REFUSED,
            )
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith("@@"):
            m = _HUNK_RE.match(lines[i])
            if not m:
                raise PatchSeriesError(
                    f"patch {path.name}: line {i + 1}: bad hunk header",
                    EXIT_REFUSED,
                )
            old_len = int(m.group(2) or 1)
            new_len = int(m.group(4) or 1)
            i += 1
            old: list[str] = []
            new: list[str] = []
            while (len(old) < old_len or len(new) < new_len) and i < len(lines):
                line = lines[i]
                tag, body = line[:1], line[1:]
                if tag == " ":
                    old.append(body)
                    new.append(body)
                elif tag == "-":
                    old.append(body)
                elif tag == "+":
                    new.append(body)
                elif line.startswith("\\"):
                    pass  # "\ No newline at end of file"
                else:
                    raise PatchSeriesError(
                        f"patch {path.name}: line {i + 1}: unexpected diff line",
                        EXIT_REFUSED,
                    )
                i += 1
            if len(old) != old_len or len(new) != new_len:
                raise PatchSeriesError(
                    f"patch {path.name}: hunk for {old_path} is truncated",
                    EXIT_REFUSED,
                )
            hunks.append(Hunk(len(hunks) + 1, int(m.group(1)), int(m.group(3)),
                              old, new))
        files.append(FileDiff(old_path, hunks))
    if not files:
        raise PatchSeriesError(f"patch {path.name}: no file diffs", EXIT_REFUSED)
    return Patch(path.name, path, headers, files, hashlib.sha256(raw).hexdigest())


def load_series(patches_dir: Path | str = DEFAULT_PATCHES_DIR) -> Series:
    patches_dir = Path(patches_dir)
    series_file = patches_dir / "series"
    if not series_file.is_file():
        raise PatchSeriesError(f"no series file at {series_file}", EXIT_REFUSED)
    version = None
    names: list[str] = []
    for line in series_file.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("vllm-version "):
            version = line.split(None, 1)[1].strip()
        else:
            names.append(line)
    if not version:
        raise PatchSeriesError(
            f"{series_file}: needs a line 'vllm-version X.Y.Z'", EXIT_REFUSED
        )
    for name in names:
        if not (patches_dir / name).is_file():
            raise PatchSeriesError(
                f"{series_file}: patch {name} does not exist", EXIT_REFUSED
            )
    return Series(patches_dir, version,
                  [parse_patch(patches_dir / n) for n in names])


# --------------------------------------------------------------------------
# The target tree
# --------------------------------------------------------------------------


def installed_vllm_dir() -> Path | None:
    """The installed vllm package directory, found without importing vllm."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def resolve_target(target: Path | str | None) -> Path:
    if target is None:
        found = installed_vllm_dir()
        if found is None:
            raise PatchSeriesError(
                "no installed vllm package found; pass --target DIR (a vllm "
                "package directory)", EXIT_REFUSED)
        target = found
    target = Path(target).resolve()
    if not (target / "__init__.py").is_file() or not (target / "_version.py").is_file():
        raise PatchSeriesError(
            f"{target} is not a vllm package directory (needs __init__.py and "
            "_version.py)", EXIT_REFUSED)
    return target


def read_vllm_version(target: Path) -> str:
    """`__version__` from <target>/_version.py, read without importing it."""
    tree = ast.parse((target / "_version.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if "__version__" in names or "version" in names:
                return str(node.value.value)
    raise PatchSeriesError(f"{target / '_version.py'} defines no __version__",
                           EXIT_REFUSED)


def check_version(target: Path, series: Series) -> str:
    version = read_vllm_version(target)
    if version != series.vllm_version:
        raise PatchSeriesError(
            f"vLLM {version} at {target}: this patch series is made for vLLM "
            f"{series.vllm_version} only (patches/series); refusing to patch",
            EXIT_REFUSED)
    return version


class Tree:
    """Files of a vllm package dir, read lazily, changed in memory."""

    def __init__(self, root: Path):
        self.root = root
        self._lines: dict[str, list[str]] = {}
        self.changed: set[str] = set()

    def path(self, rel: str) -> Path:
        # rel is "vllm/..." (as in the diffs); the root is the vllm dir itself.
        return self.root / rel.split("/", 1)[1]

    def exists(self, rel: str) -> bool:
        return rel in self._lines or self.path(rel).is_file()

    def lines(self, rel: str) -> list[str]:
        if rel not in self._lines:
            self._lines[rel] = self.path(rel).read_text(
                encoding="utf-8").splitlines(keepends=True)
        return self._lines[rel]

    def text(self, rel: str) -> str:
        return "".join(self.lines(rel))

    def set_lines(self, rel: str, lines: list[str]) -> None:
        self._lines[rel] = lines
        self.changed.add(rel)

    def write(self) -> None:
        for rel in sorted(self.changed):
            path = self.path(rel)
            _atomic_write(path, self.text(rel))
            # Fresh bytecode now, so a read-only site-packages (non-root
            # runtime user) does not recompile these modules at every start.
            try:
                py_compile.compile(str(path), doraise=True)
            except (OSError, py_compile.PyCompileError):
                pass
        self.changed.clear()


def _atomic_write(path: Path, text: str) -> None:
    # Replace, never write through: a target file may be a hard or symbolic
    # link into another tree.
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# --------------------------------------------------------------------------
# Applying hunks
# --------------------------------------------------------------------------


def _locate(lines: list[str], block: list[str], start: int, floor: int) -> int | None:
    n = len(block)
    if start >= floor and lines[start:start + n] == block:
        return start
    hits = [i for i in range(floor, len(lines) - n + 1) if lines[i:i + n] == block]
    return hits[0] if len(hits) == 1 else None


def _run_hunks(lines: list[str], hunks: list[Hunk], reverse: bool
               ) -> tuple[list[str] | None, Hunk | None]:
    """Apply hunks (or undo them); return (new lines, None) or (None, bad hunk)."""
    out: list[str] = []
    cursor = 0
    shift = 0
    for h in hunks:
        find, put = (h.new, h.old) if reverse else (h.old, h.new)
        stated = (h.new_start if reverse else h.old_start) - 1
        if not find:  # pure insertion at a position
            pos = stated + shift
        else:
            pos = _locate(lines, find, stated + shift, cursor)
        if pos is None or pos < cursor:
            return None, h
        shift = pos - stated
        out.extend(lines[cursor:pos])
        out.extend(put)
        cursor = pos + len(find)
    out.extend(lines[cursor:])
    return out, None


@dataclasses.dataclass
class PatchState:
    patch: Patch
    state: str  # "applied" (already present) | "pending" (applies cleanly)
    forward: dict[str, list[str]]  # file -> patched lines, when pending


def inspect_patch(tree: Tree, patch: Patch) -> PatchState:
    """Decide whether `patch` is already in `tree`, applies, or neither."""
    present, applies, failures = [], {}, []
    for fd in patch.files:
        if not tree.exists(fd.path):
            failures.append(f"{fd.path}: file not found in {tree.root}")
            continue
        lines = tree.lines(fd.path)
        undone, _ = _run_hunks(lines, fd.hunks, reverse=True)
        if undone is not None:
            present.append(fd.path)
            continue
        done, bad = _run_hunks(lines, fd.hunks, reverse=False)
        if done is not None:
            applies[fd.path] = done
        else:
            assert bad is not None
            failures.append(
                f"{fd.path}: hunk #{bad.number} (at line {bad.old_start}) does "
                "not match; the file differs from the release this series was "
                "made for (after an older version of this series, reinstall "
                "vLLM first)")
    if failures:
        raise PatchSeriesError(
            f"patch {patch.name} does not apply:\n  " + "\n  ".join(failures))
    if present and applies:
        raise PatchSeriesError(
            f"patch {patch.name} is only partly applied: present in "
            f"{', '.join(present)}; missing in {', '.join(applies)}")
    if present:
        return PatchState(patch, "applied", {})
    return PatchState(patch, "pending", applies)


def _inspect(tree: Tree, patch: Patch, record: dict | None) -> PatchState:
    try:
        return inspect_patch(tree, patch)
    except PatchSeriesError as e:
        earlier = {p.get("name"): p.get("sha256") for p in (record or {}).get("patches", [])}
        if earlier.get(patch.name) not in (None, patch.sha256):
            e.args = (f"{e}\n  the record {tree.root / RECORD_NAME} shows another "
                      f"version of {patch.name} applied: reinstall vLLM, then apply",)
        raise


# --------------------------------------------------------------------------
# Post-conditions
# --------------------------------------------------------------------------


def _find_function(tree_ast: ast.AST, name: str) -> ast.FunctionDef:
    found = [n for n in ast.walk(tree_ast)
             if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(found) != 1:
        raise PatchSeriesError(f"expected one function {name}, found {len(found)}")
    return found[0]


def _jit_do_not_specialize(fn: ast.FunctionDef) -> list[str] | None:
    for deco in fn.decorator_list:
        if (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute)
                and deco.func.attr == "jit"):
            for kw in deco.keywords:
                if kw.arg == "do_not_specialize":
                    return list(ast.literal_eval(kw.value))
    return None


def load_do_not_specialize(path: Path | str | None = None) -> dict:
    """The one list of do_not_specialize arguments (also read by bench/)."""
    path = Path(path) if path else DEFAULT_PATCHES_DIR / "do_not_specialize.json"
    return json.loads(Path(path).read_text())


def check_do_not_specialize(tree: Tree, spec: dict) -> list[str]:
    """Each listed kernel is @triton.jit(do_not_specialize=<exactly args>)."""
    problems = []
    for entry in spec["kernels"]:
        kernel, rel, args = entry["kernel"], entry["file"], entry["args"]
        where = f"{kernel} in {rel}"
        if not entry.get("why"):
            problems.append(f"{where}: entry has no 'why'")
        for arg in args:
            if _NEVER_UNSPECIALIZE.match(arg):
                problems.append(
                    f"{where}: {arg} feeds pointer arithmetic and must keep "
                    "its divisibility specialization")
        if not tree.exists(rel):
            problems.append(f"{where}: file not found")
            continue
        try:
            fn = _find_function(ast.parse(tree.text(rel)), kernel)
        except PatchSeriesError as e:
            problems.append(f"{where}: {e}")
            continue
        params = {a.arg: a for a in fn.args.args}
        for arg in args:
            if arg not in params:
                problems.append(f"{where}: no parameter {arg}")
            elif "constexpr" in ast.unparse(params[arg].annotation or ast.Constant(None)):
                problems.append(f"{where}: {arg} is tl.constexpr")
        actual = _jit_do_not_specialize(fn)
        if actual is None:
            problems.append(f"{where}: @triton.jit has no do_not_specialize")
        elif sorted(actual) != sorted(args):
            problems.append(f"{where}: do_not_specialize={actual}, list says {args}")
    return problems


def check_post_conditions(tree: Tree, patch: Patch, patches_dir: Path) -> list[str]:
    problems = []
    for cond in patch.post_conditions:
        kind, _, arg = cond.partition(" ")
        if kind == "match":
            rel, sep, pattern = arg.partition(" :: ")
            rel = rel.strip()
            if not sep:
                problems.append(f"malformed post-condition {cond!r}")
            elif not tree.exists(rel):
                problems.append(f"{rel}: file not found")
            elif not re.search(pattern, tree.text(rel), re.MULTILINE):
                problems.append(f"{rel}: no match for /{pattern}/")
        elif kind == "do-not-specialize":
            spec = load_do_not_specialize(patches_dir / arg.strip())
            problems += check_do_not_specialize(tree, spec)
        else:
            problems.append(
                f"unknown post-condition kind {kind!r} (allowed: match, "
                "do-not-specialize)")
    return [f"patch {patch.name}: post-condition failed: {p}" for p in problems]


# --------------------------------------------------------------------------
# Swap-AB: upstream (vllm PR #36559), verified, not patched
# --------------------------------------------------------------------------

_UTILS = "vllm/model_executor/layers/fused_moe/utils.py"
_FUSED_MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"


class _CudaCapability:
    """Just enough of a CUDA platform to evaluate vLLM's enable_swap_ab."""

    def __init__(self, capability: int):
        self.capability = capability

    def is_cuda(self) -> bool:
        return True

    def is_device_capability(self, capability: int) -> bool:
        return self.capability == capability

    def has_device_capability(self, capability: int) -> bool:
        return self.capability >= capability


def load_enable_swap_ab(tree: Tree, capability: int) -> Callable[[int, int], bool]:
    """vLLM's own enable_swap_ab, compiled from the target's source and bound
    to a platform of the given capability (no torch/vLLM import needed)."""
    fn = _find_function(ast.parse(tree.text(_UTILS)), "enable_swap_ab")
    fn.decorator_list = []  # drop functools.lru_cache
    module = ast.Module(body=[fn], type_ignores=[])
    namespace: dict = {"current_platform": _CudaCapability(capability)}
    exec(compile(module, _UTILS, "exec"), namespace)
    return namespace["enable_swap_ab"]


def nearest_config(configs: dict[int, dict], m: int) -> tuple[int, dict]:
    # Same rule as vLLM's try_get_optimal_moe_config.
    key = min(configs.keys(), key=lambda x: abs(x - m))
    return key, configs[key]


def gemm_config(entry: dict, gemm: str) -> dict:
    """One GEMM's config of a tuned entry, as patch 0003's
    try_get_optimal_moe_gemm_configs resolves it."""
    flat = {k: v for k, v in entry.items() if k not in ("w13", "w2")}
    return {**flat, **entry.get(gemm, {})}


def verify_swap_ab(tree: Tree, configs_dir: Path | None,
                   decode_sizes: Iterable[int] = range(1, DEFAULT_DECODE_MAX + 1)
                   ) -> dict:
    decode_sizes = list(decode_sizes)
    problems = []
    for rel, pattern in (
        (_UTILS, r"^def enable_swap_ab\("),
        # patch 0003 wraps the call in a per-GEMM SWAP_AB override: "SWAP_AB = (\n enable_swap_ab(...)"
        (_FUSED_MOE, r"if use_fp8_w8a8:\n\s+SWAP_AB = \(?\s*enable_swap_ab\("
                     r"config\[\"BLOCK_SIZE_M\"\], config\[\"BLOCK_SIZE_N\"\]\)"),
        (_FUSED_MOE, r"SWAP_AB=SWAP_AB,"),
    ):
        if not re.search(pattern, tree.text(rel), re.MULTILINE):
            problems.append(f"swap-AB (vllm PR #36559) missing: {rel} lacks /{pattern}/")
    if problems:
        raise PatchSeriesError("\n".join(problems))

    hopper = load_enable_swap_ab(tree, 90)
    # The rule itself: fires for small M blocks on 9.0 only.
    expect = {(90, 16, 128): True, (90, 64, 128): False, (90, 16, 32): False,
              (100, 16, 128): False, (89, 16, 128): False}
    for (cap, bm, bn), want in expect.items():
        got = load_enable_swap_ab(tree, cap)(bm, bn) if cap != 90 else hopper(bm, bn)
        if got != want:
            problems.append(
                f"enable_swap_ab(BLOCK_SIZE_M={bm}, BLOCK_SIZE_N={bn}) on "
                f"capability {cap / 10:.1f} is {got}, expected {want}")

    checked, fired = [], {}
    files = sorted(configs_dir.glob(H200_FP8_CONFIG_GLOB)) if (
        configs_dir and configs_dir.is_dir()) else []
    for cfg_file in files:
        try:
            raw = json.loads(cfg_file.read_text())
            raw.pop("triton_version", None)
            configs = {int(k): v for k, v in raw.items()}
        except (ValueError, AttributeError) as e:
            problems.append(f"{cfg_file.name}: not a fused-MoE config JSON ({e})")
            continue
        # Checked on w13, the decode GEMM swap-AB was made for, with the entry's
        # per-GEMM keys (patch 0003). A decode entry with BLOCK_SIZE_M >= 64 wastes most
        # of each 64-row wgmma (the waste swap-AB exists to remove), and a w13 with
        # swap-AB forced off gives the gain away: both are errors. An entry with a narrow
        # N tile (BLOCK_SIZE_N < 64) is a tuner's measured choice where swap-AB does not
        # apply (the H200 sweep found equal times with the swap forced on): allowed and
        # recorded, as long as swap-AB fires for some decode sizes of the file. Where it
        # fires for w2 is recorded (the tuner may turn it off there: measured faster).
        wide_m, fires, narrow_n, w2_fires = [], [], [], []
        for m in decode_sizes:
            key, entry = nearest_config(configs, m)
            w13, w2 = (gemm_config(entry, g) for g in ("w13", "w2"))
            bm, bn = w13["BLOCK_SIZE_M"], w13["BLOCK_SIZE_N"]
            if w2.get("SWAP_AB", hopper(w2["BLOCK_SIZE_M"], w2["BLOCK_SIZE_N"])):
                w2_fires.append(m)
            if w13.get("SWAP_AB", hopper(bm, bn)):
                fires.append(m)
            elif bm >= 64:
                wide_m.append(f"M={m} (entry {key}: BLOCK_SIZE_M={bm}, BLOCK_SIZE_N={bn})")
            elif "SWAP_AB" in w13 and bn >= 64:
                wide_m.append(f"M={m} (entry {key}: w13 SWAP_AB=false)")
            else:
                narrow_n.append(m)
        if wide_m or not fires:
            problems.append(
                f"swap-AB does not fire for {cfg_file.name} at " + ", ".join(
                    wide_m or [f"any decode size M={min(decode_sizes)}..{max(decode_sizes)}"])
                + "; it needs BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64")
        fired[cfg_file.name] = {"fires_at": _ranges(fires), "narrow_n_tile_at": _ranges(narrow_n),
                                "w2_fires_at": _ranges(w2_fires)}
        checked.append(cfg_file.name)
    if problems:
        raise PatchSeriesError("\n".join(problems))
    return {
        "upstream": "vllm PR #36559 (0.25.0)",
        "present": True,
        "decode_batch_sizes": [min(decode_sizes), max(decode_sizes)],
        "configs_dir": str(configs_dir) if configs_dir else None,
        "configs_checked": checked,
        "per_config": fired,
    }


def _ranges(ms: list[int]) -> str:
    """[1, 2, 3, 8] -> "1-3,8" (compact for the record and the log)."""
    out, start = [], None
    for i, m in enumerate(ms):
        if start is None:
            start = m
        if i + 1 == len(ms) or ms[i + 1] != m + 1:
            out.append(str(start) if start == m else f"{start}-{m}")
            start = None
    return ",".join(out)


# --------------------------------------------------------------------------
# Record
# --------------------------------------------------------------------------


def read_record(vllm_dir: Path | str | None = None) -> dict | None:
    """The record `apply` wrote into the vllm package, or None when there is
    none (unpatched vLLM, no vLLM, unreadable record). Never raises."""
    try:
        directory = Path(vllm_dir) if vllm_dir else installed_vllm_dir()
        if directory is None:
            return None
        record = json.loads((directory / RECORD_NAME).read_text())
        return record if isinstance(record, dict) else None
    except (OSError, ValueError):
        return None


def describe_record(record: dict | None) -> str:
    """The launcher's start-up log line for the record (read_record's result)."""
    if not record:
        return "vLLM patches: none applied (stock vLLM)"
    names = ", ".join(p.get("name", "?") if isinstance(p, dict) else str(p)
                      for p in record.get("patches", []))
    return (f"vLLM patches applied to {record.get('vllm_version', '?')}: {names or 'none'}"
            f" (applied {record.get('applied_at', '?')})")


def _record_identity(record: dict | None) -> tuple:
    if not record:
        return ()
    return (record.get("record_format"), record.get("vllm_version"),
            tuple((p.get("name"), p.get("sha256")) for p in record.get("patches", [])))


# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------


def apply_series(target: Path | str | None = None,
                 patches_dir: Path | str = DEFAULT_PATCHES_DIR,
                 configs_dir: Path | str | None = DEFAULT_CONFIGS_DIR,
                 log: Callable[[str], None] = print) -> dict:
    """Apply the series to a vllm package dir; return the record."""
    target = resolve_target(target)
    series = load_series(patches_dir)
    version = check_version(target, series)
    tree = Tree(target)
    old = read_record(target)
    results = []
    for patch in series.patches:
        st = _inspect(tree, patch, old)
        for rel, lines in st.forward.items():
            tree.set_lines(rel, lines)
        results.append((patch, "applied" if st.state == "pending" else "already-applied"))
    problems = []
    for patch in series.patches:
        problems += check_post_conditions(tree, patch, series.directory)
    if problems:
        raise PatchSeriesError("\n".join(problems))
    swap_ab = verify_swap_ab(tree, Path(configs_dir) if configs_dir else None)

    changed = sorted(tree.changed)
    tree.write()  # only now, after every patch and check passed in memory
    for patch, result in results:
        log(f"{patch.name}: {result}")
    if not swap_ab["configs_checked"]:
        log(f"swap-AB (upstream, not patched): present; no H200 fp8 configs in {configs_dir} to check")
    for name, where in swap_ab["per_config"].items():
        narrow = where["narrow_n_tile_at"]
        log(f"swap-AB (upstream, not patched): {name}: fires at decode M={where['fires_at']}"
            + (f"; M={narrow} use a tuned narrow N tile (BLOCK_SIZE_N < 64), where it does not apply" if narrow else ""))

    record = {
        "record_format": RECORD_FORMAT,
        "tool": "serving.patch_series",
        "vllm_version": version,
        "vllm_dir": str(target),
        "applied_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "patches": [
            {"name": p.name, "sha256": p.sha256, "what": p.summary,
             "origin": p.header("Origin"), "applied_upstream": p.header("Applied-Upstream"),
             "result": result}
            for p, result in results
        ],
        "files_changed": [r.split("/", 1)[1] for r in changed],
        "swap_ab": swap_ab,
    }
    if not changed and _record_identity(old) == _record_identity(record):
        log(f"{target}: already patched; nothing changed")
        return old  # type: ignore[return-value]
    _atomic_write(target / RECORD_NAME, json.dumps(record, indent=2) + "\n")
    log(f"record written to {target / RECORD_NAME}")
    return record


def check_series(target: Path | str | None = None,
                 patches_dir: Path | str = DEFAULT_PATCHES_DIR,
                 configs_dir: Path | str | None = DEFAULT_CONFIGS_DIR,
                 log: Callable[[str], None] = print) -> None:
    """Raise unless the target carries the whole series, its post-conditions
    hold, swap-AB fires and the record matches."""
    target = resolve_target(target)
    series = load_series(patches_dir)
    check_version(target, series)
    tree = Tree(target)
    record = read_record(target)
    problems = []
    for patch in series.patches:
        try:
            st = _inspect(tree, patch, record)
        except PatchSeriesError as e:
            problems.append(str(e))
            continue
        if st.state != "applied":
            problems.append(f"patch {patch.name} is not applied to {target}")
        else:
            problems += check_post_conditions(tree, patch, series.directory)
            log(f"{patch.name}: applied, post-conditions hold")
    try:
        verify_swap_ab(tree, Path(configs_dir) if configs_dir else None)
        log("swap-AB (upstream): present and fires for the H200 fp8 configs")
    except PatchSeriesError as e:
        problems.append(str(e))
    want = [(p.name, p.sha256) for p in series.patches]
    if record is None:
        problems.append(f"no record {target / RECORD_NAME}")
    elif [(p.get("name"), p.get("sha256")) for p in record.get("patches", [])] != want:
        problems.append(f"record {target / RECORD_NAME} does not list this series")
    if problems:
        raise PatchSeriesError("\n".join(problems))


def list_series(patches_dir: Path | str = DEFAULT_PATCHES_DIR, markdown: bool = False) -> str:
    series = load_series(patches_dir)
    rows = [(p.name, p.summary, p.header("Origin"), p.header("Forwarded"),
             p.header("Applied-Upstream")) for p in series.patches]
    rows.append(("(none: verified only)",
                 "Swap-AB in the Triton fused-MoE kernel for decode blocks on Hopper",
                 "vllm PR #36559", "-", "0.25.0"))
    if markdown:
        out = [f"Patch series for vLLM {series.vllm_version} "
               "(`python -m serving.patch_series list --markdown`).", "",
               "| Patch | What | Origin | Forwarded | Upstream status |",
               "|---|---|---|---|---|"]
        for name, what, origin, fwd, upstream in rows:
            status = "not upstream" if upstream == "no" else f"upstream in {upstream}"
            cells = [f"`{name}`" if name.endswith(".patch") else name, what,
                     origin, fwd, status]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        return "\n".join(out) + "\n"
    out = [f"series for vLLM {series.vllm_version}:"]
    for name, what, origin, fwd, upstream in rows:
        out.append(f"{name}\n    what: {what}\n    origin: {origin}\n"
                   f"    forwarded: {fwd}\n    applied upstream: {upstream}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serving.patch_series",
        description="Apply or check the LMI patch series on a vLLM package.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("apply", "apply the series (idempotent)"),
                            ("check", "verify the series is applied")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--target", type=Path, default=None,
                       help="a vllm package directory (default: the installed vllm)")
        p.add_argument("--patches", type=Path, default=DEFAULT_PATCHES_DIR,
                       help="directory holding series and the patches")
        p.add_argument("--configs", type=Path, default=DEFAULT_CONFIGS_DIR,
                       help="tuned fused-MoE config JSONs the image ships")
    p = sub.add_parser("list", help="list the patches")
    p.add_argument("--patches", type=Path, default=DEFAULT_PATCHES_DIR)
    p.add_argument("--markdown", action="store_true", help="a markdown table")
    args = parser.parse_args(argv)
    try:
        if args.command == "apply":
            apply_series(args.target, args.patches, args.configs)
        elif args.command == "check":
            check_series(args.target, args.patches, args.configs)
        else:
            sys.stdout.write(list_series(args.patches, args.markdown))
    except PatchSeriesError as e:
        print(f"patch_series {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
