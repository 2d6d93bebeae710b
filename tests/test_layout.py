"""No module outside tests/ imports from tests/ (tools live in tools/, the harness in bench/), and the three places
serving/ runs keep apart: the build-time patch tooling, the client tools and the container's runtime."""
from __future__ import annotations

import ast
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


# The three places the code runs. At image build: the patch tooling. On the user's machine: the client tools
# (endpoint/, boto3, kept out of the image). In the container: the rest of serving/.
BUILD_TIME = {"serving.patch_series", "serving.patch_format", "serving.moe_configs", "serving.paths"}
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


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_patch_tooling_imports_only_the_standard_library():
    """The image build runs it before the runtime's packages exist: the standard library and itself only."""
    for name in BUILD_TIME:
        path = ROOT / (name.replace(".", "/") + ".py")
        outside = {m for m in _imports(path) if m.split(".")[0] not in sys.stdlib_module_names
                   and not {m, m.rpartition(".")[0]} & BUILD_TIME}
        assert not outside, f"{name} imports {sorted(outside)}"


def test_the_runtime_never_imports_the_client_tools():
    runtime = [p for p in sorted((ROOT / "serving").rglob("*.py")) if _module(p) not in BUILD_TIME | CLIENT_TOOLS]
    assert len(runtime) > 10
    for path in runtime:
        used = {m for m in _imports(path) if any(m == c or m.startswith(c + ".") for c in CLIENT_TOOLS)}
        assert not used, f"{_module(path)} imports the client tools {sorted(used)}"
