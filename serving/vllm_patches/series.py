"""The patch series' files: patches/series and the patches it lists, parsed.

patches/series names the vLLM release (`vllm-version X.Y.Z`) and the patches in
order. Each patch is a unified diff with paths a/vllm/... and b/vllm/...,
preceded by a DEP-3 style header (Description, Origin, Forwarded,
Applied-Upstream, Last-Update, X-Post-Condition). apply.py applies and checks
them.

Standard library only (the image build runs it before anything imports vLLM).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

from ..paths import PATCHES_DIR

DEFAULT_PATCHES_DIR = PATCHES_DIR

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
    headers, i = _parse_header(lines)
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
        hunks, i = _parse_hunks(lines, i + 2, f"patch {path.name}", old_path)
        files.append(FileDiff(old_path, hunks))
    if not files:
        raise PatchSeriesError(f"patch {path.name}: no file diffs", EXIT_REFUSED)
    return Patch(path.name, path, headers, files, hashlib.sha256(raw).hexdigest())


def _parse_header(lines: list[str]) -> tuple[dict[str, list[str]], int]:
    """The DEP-3 header: "Key: value" lines, continuation lines start with a
    space; it ends at a line "---" or at the first file header. Returns the
    headers (lower-case keys) and the index of the first line after it."""
    headers: dict[str, list[str]] = {}
    i = 0
    last_key = None
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
    return headers, i


def _parse_hunks(lines: list[str], i: int, where: str, rel: str) -> tuple[list[Hunk], int]:
    """The hunks of one file diff starting at lines[i]; returns them and the
    index of the first line after them."""
    hunks: list[Hunk] = []
    while i < len(lines) and lines[i].startswith("@@"):
        m = _HUNK_RE.match(lines[i])
        if not m:
            raise PatchSeriesError(f"{where}: line {i + 1}: bad hunk header", EXIT_REFUSED)
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
                raise PatchSeriesError(f"{where}: line {i + 1}: unexpected diff line", EXIT_REFUSED)
            i += 1
        if len(old) != old_len or len(new) != new_len:
            raise PatchSeriesError(f"{where}: hunk for {rel} is truncated", EXIT_REFUSED)
        hunks.append(Hunk(len(hunks) + 1, int(m.group(1)), int(m.group(3)), old, new))
    return hunks, i


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
