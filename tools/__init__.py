"""Developer tools, run from the repository root (e.g. `python3 -m tools.image_build patches`); none of
them is part of the image. The tests and bench/ import launcher_process from here."""
