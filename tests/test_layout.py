"""No module outside tests/ imports from tests/ (tools live in tools/, the harness in bench/)."""
from __future__ import annotations

import ast
import subprocess
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
