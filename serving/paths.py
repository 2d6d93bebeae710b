"""Where the project's own files are: the folder that holds serving/, patches/ and configs/ (a checkout, or the
image's application folder). Standard library only: the build-time patch tooling imports it too."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATCHES_DIR = ROOT / "patches"
CONFIGS_DIR = ROOT / "configs"
