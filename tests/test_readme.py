"""README stays in step with the code it documents: the two commands, CI's command, the pages it links, its size."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DEVELOPMENT = (ROOT / "docs" / "development.md").read_text()


def test_two_commands_and_ci_runs_the_readme_test_command():
    block = re.search(r"## Two commands\n\n```sh\n(.*?)```", README, re.S).group(1)
    commands = [l.split("#")[0].strip() for l in block.splitlines() if l.strip()]
    assert commands == ["make run", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M)


def test_readme_is_short_and_its_prose_lines_are_too():
    lines = README.splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail to docs/"
    in_code = False
    for n, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code or line.startswith("|") or line.startswith("<!--"):
            continue
        assert len(line) <= 120, f"README.md line {n} has {len(line)} characters (prose lines: at most 120)"


def test_readme_names_no_benchmark_run():
    found = re.findall(r"\b(?:run|probe) \d+\b", README, re.I)
    assert not found, f"README.md names benchmark runs {found}: figures come from the generated table"


def test_every_page_the_readme_links_exists():
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert len(links) >= 10
    for link in links:
        if "://" in link:
            continue
        assert (ROOT / link).exists(), f"README.md links {link}, which does not exist"


def test_every_file_the_layout_table_names_exists():
    """Each file or folder docs/development.md's Layout table names in backticks exists in its row's folder,
    directly or below it: a renamed or removed module is not left in the map a newcomer reads first."""
    layout = DEVELOPMENT.split("## Layout", 1)[1]
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
            assert found, f"docs/development.md's Layout names {name} under {m.group(1)}, which holds no such file"
    assert named >= 20
