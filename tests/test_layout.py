"""No module outside tests/ imports from tests/ (tools live in tools/, the harness in bench/), and the three places
the code runs keep apart: the build-time patch tooling (serving/vllm_patches/), the client tools (endpoint/) and the
container's runtime (the rest of serving/)."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_imports_from_tests():
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "*.py"], capture_output=True, text=True,
                           check=True).stdout.split()
    test_modules = {Path(f).stem for f in files if f.startswith("tests/")} | {"tests"}
    sources = [f for f in files if not f.startswith("tests/")]
    assert sources
    bad = []
    for f in sources:
        for node in ast.walk(ast.parse((ROOT / f).read_text(), f)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{f}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in test_modules]
    assert not bad, bad


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _path(module: str) -> Path:
    base = ROOT.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


# The three places the code runs. At image build: the patch tooling, every module of serving/vllm_patches/, with
# what `python -m serving.vllm_patches` imports besides (serving/__init__.py, and serving/paths.py, the one place
# that knows the repository root). On the user's machine: the client tools (endpoint/, boto3, kept out of the
# image). In the container: the rest of serving/.
PATCH_TOOLING = ROOT / "serving" / "vllm_patches"
BUILD_TIME = {_module(p) for p in PATCH_TOOLING.rglob("*.py")} | {"serving", "serving.paths"}
CLIENT_TOOLS = {"endpoint"}


def _imports(path: Path) -> set[str]:
    """Every module a file imports, anywhere in it, relative imports resolved against its package."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}  # `from . import x`: x may be a module
    return found


def test_patch_tooling_imports_only_the_standard_library():
    """The image build runs it before the runtime's packages exist: the standard library and itself only."""
    assert {"serving.vllm_patches.apply", "serving.vllm_patches.series", "serving.vllm_patches.moe_configs",
            "serving.vllm_patches.__main__"} <= BUILD_TIME
    def allowed(m: str) -> bool:
        # `from ..paths import ROOT` reads as serving.paths.ROOT: a name of a build-time module, not a module
        parent = m.rpartition(".")[0]
        return (m.split(".")[0] in sys.stdlib_module_names or m in BUILD_TIME
                or parent in BUILD_TIME and not _path(m).exists())

    for name in sorted(BUILD_TIME):
        outside = {m for m in _imports(_path(name)) if not allowed(m)}
        assert not outside, f"{name} imports {sorted(outside)}"


def test_the_venv_is_patched_again_when_the_patch_tooling_changes():
    """The Makefile's `.patched` rule depends on every file of the patch tooling (the image build copies serving/
    whole, so it sees them all)."""
    rule = next(l for l in (ROOT / "Makefile").read_text().splitlines() if l.startswith("$(VENV)/.patched:"))
    prerequisites = set()
    for word in re.sub(r"\$\(wildcard ([^)]*)\)", r"\1", rule.partition(":")[2]).split():
        prerequisites |= {p.relative_to(ROOT).as_posix() for p in ROOT.glob(word)}
    tooling = {_path(m).relative_to(ROOT).as_posix() for m in BUILD_TIME - {"serving"}}
    assert tooling <= prerequisites, f"the .patched rule misses {sorted(tooling - prerequisites)}"


def test_the_runtime_never_imports_the_client_tools():
    runtime = [p for p in sorted((ROOT / "serving").rglob("*.py")) if _module(p) not in BUILD_TIME | CLIENT_TOOLS]
    assert len(runtime) > 10
    for path in runtime:
        used = {m for m in _imports(path) if any(m == c or m.startswith(c + ".") for c in CLIENT_TOOLS)}
        assert not used, f"{_module(path)} imports the client tools {sorted(used)}"
