"""README stays in step with the code it documents: the two commands, the patch table, CI's command."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_patch_table_is_the_tools_listing():
    out = subprocess.run([sys.executable, "-m", "serving.vllm_patches", "list", "--markdown"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    table = "\n".join(l for l in out.splitlines() if l.startswith("|"))
    assert table in README, "README's patch table is stale: paste `python -m serving.vllm_patches list --markdown`"


def test_two_commands_and_ci_runs_the_readme_test_command():
    block = re.search(r"## Two commands\n\n```sh\n(.*?)```", README, re.S).group(1)
    commands = [l.split("#")[0].strip() for l in block.splitlines() if l.strip()]
    assert commands == ["make run", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M)


def test_every_file_the_layout_table_names_exists():
    """Each file or folder README's Layout table names in backticks (`settings.py`, `lmi/`) exists in its row's
    folder, directly or below it: a renamed or removed module is not left in the map a newcomer reads first."""
    layout = README.split("## Layout", 1)[1]
    named = 0
    for row in layout.splitlines():
        m = re.match(r"^\| `([^`]+)`(?:, `[^`]+`)* \| (.*) \|$", row)
        if not m:
            continue
        base = ROOT / m.group(1)
        for name in re.findall(r"`([^`]+)`", m.group(2)):
            if not re.fullmatch(r"[\w./-]+(\.(py|sh|md|json|txt|lock|toml|ini)|/)", name):
                continue  # a command or a setting, not a path
            named += 1
            found = (base / name).exists() or (ROOT / name).exists() or (
                base.is_dir() and any(base.rglob(name.rstrip("/"))))
            assert found, f"README's Layout names {name} under {m.group(1)}, which holds no such file"
    assert named >= 30
