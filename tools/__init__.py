"""Developer tools: the image build helper (Makefile, Dockerfile comments, make image-test) and the
launcher start/stop helper (tests, bench). Run them from the repository root: `python3 -m tools.image_build`."""
