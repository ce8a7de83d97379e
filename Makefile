# gristmill: `make demo` and `make test` work on a fresh machine (they create .venv themselves).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Test processes (pytest-xdist) per tier. The in-process tier computes: one worker per core. The
# process tier's tests wait on subprocesses and torchrun rendezvous as much as they compute: a third
# worker on CI's 2 cores uses what two leave idle (5-25% faster in every pairing measured,
# bench/RESULTS.md "What `make test` costs").
TEST_WORKERS ?= 2
PROCESS_TEST_WORKERS ?= 3

.PHONY: setup demo test lint clean

# Bytecode only for what gristmill imports, not for all 25k modules the packages ship: pip compiles
# every one (~75 CPU s, 90 of the install's 175 s wall on 2 cores); importing what the commands import
# (Ray's and the trackers' too: each Ray worker and tracked run imports them) writes the ~5k they use
# (~17 CPU s); its warnings (torchao's optional CUDA kernels) go to .venv/warm-imports.log. A module
# imported later is compiled at its first import (`make test` and `make demo` write bytecode whatever
# PYTHONDONTWRITEBYTECODE says).
WARM_IMPORTS := import torch, torch._dynamo, training.train, training.launch, pipelines.cli, validation.eval, \
  pipelines.build, pipelines.tokenizer_train, pipelines.ray_executor, ray, wandb, trackio, \
  torch.utils.tensorboard, lm_eval.evaluator, pandas, matplotlib.pyplot, duckdb, boto3; \
  from transformers import LlamaForCausalLM

EXTRAS := .[eval,dev,ray,wandb,trackio,float8]

# The rest with uv (put in the venv by pip): pip spent ~130 s of CI's wall here, ~90 of them resolving
# (every release of ~190 projects read from three indexes, one page after another, in Python) and
# ~40 unpacking one wheel at a time; uv installs the same set in ~20 s, its cache cold, its check ~25 s
# (bench/RESULTS.md). tools/uv_install.py hands uv pip's own settings (uv reads no pip.conf) and
# checks that each distribution is the file pip would take (uv reads a version's files from the first
# index listing it), reinstalling by pip any that may not be. uv keeps the venv's own torch, installed
# above. It does not see the packages of a --system-site-packages venv's interpreter
# (astral-sh/uv#4466): there it would put a second torch, pip's default CUDA build, in the venv and
# shadow the interpreter's numpy and the rest, so such a venv is filled by pip, which keeps what
# satisfies the package. Where uv or the check fails (a mirror without uv, pip settings uv has no
# equivalent of, an index without a version the check asks for), pip completes the install and then
# installs again every distribution uv installed (completing alone kept uv's files unchecked: review
# RV30b F1). INSTALLER=pip chooses pip (a venv made already: `rm -rf .venv` first; the stamp knows
# nothing of the installer).
UV_VERSION := 0.13.9
INSTALLER ?= uv
PIP_REST = $(PY) -m pip install -q --no-compile -e "$(EXTRAS)"

# torch first, chosen here rather than by pip: a bare `torch` requirement on a machine without one
# pulls several GB of CUDA wheels. An interpreter that already has torch (say a CUDA build) gets a
# venv that sees it (--system-site-packages) and keeps it; a GPU box without torch gets pip's
# default CUDA build; everything else gets the CPU wheel.
$(STAMP): pyproject.toml
	@if [ ! -x $(PY) ]; then \
	  if $(PYTHON) -c "import torch" 2>/dev/null; then \
	    echo "keeping the existing torch of $(PYTHON)"; $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else $(PYTHON) -m venv $(VENV); fi; fi
	@if ! $(PY) -c "import torch" 2>/dev/null; then \
	  if command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install --no-compile torch; \
	  else $(PY) -m pip install --no-compile torch==2.13.0; fi; fi
	@if grep -qx "include-system-site-packages = true" $(VENV)/pyvenv.cfg; then \
	  echo "installing with pip, which keeps what $(VENV) sees of its interpreter's packages"; $(PIP_REST); \
	elif [ "$(INSTALLER)" = pip ]; then echo "installing with pip (INSTALLER=pip)"; $(PIP_REST); \
	else echo "installing with uv"; { $(PY) -m pip install -q --no-compile uv==$(UV_VERSION) && \
	  $(PY) tools/uv_install.py -q -e "$(EXTRAS)"; } || { echo "uv's install or its check failed (above): \
	pip installs, and installs again what uv installed"; $(PIP_REST) && $(PY) tools/uv_install.py --by-pip; }; fi
	@echo "writing the bytecode of what gristmill imports"; \
	  env -u PYTHONDONTWRITEBYTECODE $(PY) -c "$(WARM_IMPORTS)" 2>$(VENV)/warm-imports.log || \
	  { cat $(VENV)/warm-imports.log; exit 1; }
	@touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/gristmill demo

# Two tiers (tests/helpers/tiers.py): the in-process tests first (a failure there stops before the
# rest), then the modules that start processes. Both share the artifacts built once per run
# (tests/helpers/shared.py) in a fresh folder, removed after them; each lists its slowest tests.
# Bytecode is written even where the environment says not to (PYTHONDONTWRITEBYTECODE, common in
# containers): else every test process, fresh interpreter and forked run compiled the project's
# modules again from source (~0.2 CPU s each, hundreds of processes).
# --dist loadgroup (tests/conftest.py's scheduler): a module marked pytest.mark.xdist_group("NAME")
# runs on one worker, so its module-scoped servers and builds (a Ray instance, moto, a hub) start
# once; every other test is spread one by one. Here, not in pyproject's addopts: a pytest without
# xdist (the GPU image's, for tests/gpu) would refuse the option.
PYTEST := $(PY) -m pytest -q --dist loadgroup --durations=25 $(PYTEST_ARGS)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@shared=$$(mktemp -d) && trap 'rm -rf "$$shared"' EXIT && export GRISTMILL_TEST_SHARED="$$shared" && \
	  unset PYTHONDONTWRITEBYTECODE && \
	  echo "== in-process tier" && $(PYTEST) -n $(TEST_WORKERS) --tier in-process && \
	  echo "== process tier" && $(PYTEST) -n $(PROCESS_TEST_WORKERS) --tier process

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf runs .pytest_cache
