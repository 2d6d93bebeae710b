"""docs/settings.md, the settings reference, generated from the settings table (serving/settings.py).

    python -m serving.settings_doc           # print the page
    python -m serving.settings_doc --write   # write docs/settings.md

The page holds one row per setting (its key, serving.properties and environment names, vLLM flag, default and
help text) and, below the table, the reasons behind the defaults (each row's `why`), which `--list-settings` and
`--help` leave out.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from .paths import ROOT
from .settings import SETTINGS, Setting, default_cell, flag_cell, meaning

PAGE = ROOT / "docs" / "settings.md"
COMMAND = "python -m serving.settings_doc --write"
WIDTH = 120

INTRO = """\
Every setting the container reads, with each name it answers to. `python -m serving --list-settings` prints the same
table without the reasons; `python -m serving --dry-run` prints each effective value with its source.

## Sources and precedence

Settings come from these sources, weakest first:

1. the defaults in the table below;
2. defaults that depend on the build or the model: on the CPU build a fixed 256 MiB KV cache (unless
   `gpu_memory_utilization` or `kv_cache_memory_bytes` is set), for the embedded model `max_model_len=2048`, and
   `tensor_parallel_size` as every visible GPU;
3. `serving.properties` in the model directory, written `option.<key>=<value>` (LMI's top-level keys such as
   `engine=Python` too);
4. the environment: `OPTION_<KEY>` (LMI), `SM_VLLM_<FLAG>` (vLLM's SageMaker image), and the TGI/HF names.

Where several names of one setting are set in one source, the canonical key wins over an alias, which wins over
`SM_VLLM_<FLAG>`, which wins over the TGI/HF names; the environment column lists each setting's names strongest first.
Locations (`model_dir`, `cache_dir`, `python`, ...) are read from the environment only.

Any other `option.<k>`, `OPTION_<K>` or `SM_VLLM_<K>` that is an argument of the installed vLLM's OpenAI server passes
through, parsed by vLLM's own parser. An unknown key or a value that does not parse stops the start with exit code 2
and one line naming the key, its source and what is allowed.
"""


def keys_cell(s: Setting) -> str:
    keys = ", ".join(f"`option.{k}`" for k in s.option_keys) or "(environment only)"
    return keys + (f", `{s.key}=` (top level)" if s.top_level else "")


def row(s: Setting) -> str:
    envs = ", ".join(f"`{e}`" for e in s.env_names)
    text = meaning(s) + (f" [Why?](#{s.key})" if s.why else "")
    return f"| `{s.key}` | {keys_cell(s)} | {envs} | {flag_cell(s)} | {default_cell(s)} | {text} |"


def page() -> str:
    """The whole of docs/settings.md."""
    out = ["# Settings", "", f"<!-- Generated from serving/settings.py by `{COMMAND}`: edit the table there. -->",
           "", INTRO, "## The settings", "",
           "| key | serving.properties | environment | vLLM flag | default | what it does |",
           "|---|---|---|---|---|---|"]
    out += [row(s) for s in SETTINGS]
    out += ["", "## Why the defaults are what they are", "",
            *textwrap.wrap("The measurements behind these defaults, with the commands that reproduce them, are in "
                           "[the performance page](performance.md).", WIDTH)]
    for s in SETTINGS:
        if s.why:
            out += ["", f"### {s.key}", "", *textwrap.wrap(s.why, WIDTH, break_on_hyphens=False)]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serving.settings_doc", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {PAGE.relative_to(ROOT)} instead of printing it")
    args = ap.parse_args(argv)
    if args.write:
        PAGE.parent.mkdir(parents=True, exist_ok=True)
        PAGE.write_text(page())
    else:
        sys.stdout.write(page())
    return 0


if __name__ == "__main__":
    sys.exit(main())
