"""Apply the project's patch series (patches/series) to an installed vLLM, and check it.

    python -m serving.vllm_patches apply [--target DIR]   # DIR: a vllm package dir
    python -m serving.vllm_patches check [--target DIR] [--vllm-version X --expect-patches A,B]
    python -m serving.vllm_patches list [--markdown]

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
configs/ (moe_configs.py holds what a config means). The result is
recorded in <vllm>/_lmi_patches.json (read_record()); `check` with
--vllm-version/--expect-patches also compares the record with the image's build
arguments.

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
import importlib.util
import json
import os
import py_compile
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..paths import CONFIGS_DIR
from .moe_configs import MoEConfigError, find_function, verify_swap_ab
from .series import (DEFAULT_PATCHES_DIR, EXIT_REFUSED, Hunk, Patch,
                     PatchSeriesError, Series, load_series)

DEFAULT_CONFIGS_DIR = CONFIGS_DIR
RECORD_NAME = "_lmi_patches.json"
RECORD_FORMAT = 1
# Arguments that feed pointer arithmetic keep Triton's divisibility
# specialization (it lets Triton vectorize loads); never list them.
_NEVER_UNSPECIALIZE = re.compile(r"^(stride.*|K|N)$")

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
            fn = find_function(ast.parse(tree.text(rel)), kernel)
        except MoEConfigError as e:
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


def _verify_swap_ab(tree: Tree, configs_dir: Path | str | None) -> dict:
    """Swap-AB is upstream, not patched: check it fires for the shipped configs."""
    try:
        return verify_swap_ab(tree.text, Path(configs_dir) if configs_dir else None)
    except MoEConfigError as e:
        raise PatchSeriesError(str(e)) from e


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
    swap_ab = _verify_swap_ab(tree, configs_dir)

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
        "tool": "serving.vllm_patches",
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
                 log: Callable[[str], None] = print,
                 vllm_version: str | None = None,
                 expect_patches: str = "") -> None:
    """Raise unless the target carries the whole series, its post-conditions
    hold, swap-AB fires and the record matches. With `vllm_version` and
    `expect_patches` (patch names without .patch, comma or space separated; empty:
    not checked), the record must also name that vLLM release and those patches,
    as the image's build arguments and labels do."""
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
        _verify_swap_ab(tree, configs_dir)
        log("swap-AB (upstream): present and fires for the H200 fp8 configs")
    except PatchSeriesError as e:
        problems.append(str(e))
    want = [(p.name, p.sha256) for p in series.patches]
    if record is None:
        problems.append(f"no record {target / RECORD_NAME}")
    elif [(p.get("name"), p.get("sha256")) for p in record.get("patches", [])] != want:
        problems.append(f"record {target / RECORD_NAME} does not list this series")
    if vllm_version is not None or expect_patches:
        problems += _check_build_args(record or {}, vllm_version, expect_patches, log)
    if problems:
        raise PatchSeriesError("\n".join(problems))


def _check_build_args(record: dict, vllm_version: str | None, expect_patches: str,
                      log: Callable[[str], None]) -> list[str]:
    """The record against the image's VLLM_VERSION and PATCHES build arguments."""
    names = ",".join(p["name"].removesuffix(".patch") for p in record.get("patches", []))
    want = expect_patches.replace(" ", ",")
    ver = record.get("vllm_version")
    log(f"vLLM {ver} patches: {names or '(none)'}")
    if (vllm_version is None or ver == vllm_version) and (not want or want == names):
        return []
    return [f"patch record {ver} [{names}] disagrees with build args "
            f"VLLM_VERSION={vllm_version} PATCHES={want}"]


def list_series(patches_dir: Path | str = DEFAULT_PATCHES_DIR, markdown: bool = False) -> str:
    series = load_series(patches_dir)
    rows = [(p.name, p.summary, p.header("Origin"), p.header("Forwarded"),
             p.header("Applied-Upstream")) for p in series.patches]
    rows.append(("(none: verified only)",
                 "Swap-AB in the Triton fused-MoE kernel for decode blocks on Hopper",
                 "vllm PR #36559", "-", "0.25.0"))
    if markdown:
        out = [f"Patch series for vLLM {series.vllm_version} "
               "(`python -m serving.vllm_patches list --markdown`).", "",
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
        prog="python -m serving.vllm_patches",
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
    check = sub.choices["check"]
    check.add_argument("--vllm-version", default=None,
                       help="the vLLM release the record must name (the image's VLLM_VERSION)")
    check.add_argument("--expect-patches", default="",
                       help="patch names without .patch, comma or space separated, that the record must "
                            "list in order (the image's PATCHES label; empty: not checked)")
    p = sub.add_parser("list", help="list the patches")
    p.add_argument("--patches", type=Path, default=DEFAULT_PATCHES_DIR)
    p.add_argument("--markdown", action="store_true", help="a markdown table")
    args = parser.parse_args(argv)
    try:
        if args.command == "apply":
            apply_series(args.target, args.patches, args.configs)
        elif args.command == "check":
            check_series(args.target, args.patches, args.configs,
                         vllm_version=args.vllm_version, expect_patches=args.expect_patches)
        else:
            sys.stdout.write(list_series(args.patches, args.markdown))
    except PatchSeriesError as e:
        print(f"vllm_patches {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    return 0
