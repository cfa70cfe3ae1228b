# Everything installs into .venv (Python 3.11+); `make test` is the README's test command. The
# research recipes (the demos, the shipped models, your device, a lent GPU's) are scripts in
# recipes/ that hold their commands, defaults and comments; a target here runs its script.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install lint test test-e2e test-all accelerator-check gpu-run gpu-reference gpu-wheels demo demo-model \
  ktc-demo ktc-model ktc-heldout \
  cdeit16-model device-model moving-demo train-test bench clean config-docs

install: $(BIN)/.installed

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $@

# The linter and formatter first (pyproject.toml's settings), then the suite in TEST_WORKERS
# processes (pytest-xdist; 2 suits 2 cores: 3 was slower there; each worker holds 8 fake devices
# and its own session fixtures, so more workers need more memory); tests sharing an expensive
# fixture go to one worker (--dist loadgroup, tests/conftest.py's SHARED_FIXTURES). Huge-page-backed malloc:
# XLA:CPU's large temporaries fault in far faster (cdeit_jax/common/cpu_tuning.py).
# `make test` leaves out the end-to-end runs of the commands (marker e2e: `make test-e2e`, which
# CI runs after it) and the slow checks (`make test-all` runs every test).
TEST_WORKERS ?= 2
PYTEST = GLIBC_TUNABLES=glibc.malloc.hugetlb=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup
test: install lint
	$(PYTEST)

test-e2e: install
	$(PYTEST) -m "e2e and not slow"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Every test: the README's, the end-to-end and the slow ones (about 27 minutes on 2 cores).
test-all: install
	$(PYTEST) -m "slow or not slow"

# $(call recipe,SCRIPT ARGS,VARIABLES): bash recipes/SCRIPT ARGS with BIN and each of VARIABLES
# that is set (on make's command line, in the environment, here) in its environment
recipe = $(strip $(foreach v,BIN $(2),$(if $(filter undefined,$(origin $(v))),,$(v)='$($(v))'))) bash recipes/$(1)

# The embedded default (recipes/demo.sh): the demo model trained on 2 CPU cores (demo-model),
# evaluated beside Tikhonov (demo), a moving sequence reconstructed by it (moving-demo).
DEMO_RUN ?= runs/demo
DEMO_VARS = DEMO_DATA DEMO_FOREIGN DEMO_RUN DEMO_EVAL MOVING
demo: demo-model
	@$(call recipe,demo.sh eval,$(DEMO_VARS))
demo-model: install
	@$(call recipe,demo.sh model,$(DEMO_VARS))
moving-demo: install
	@$(call recipe,demo.sh moving,$(DEMO_VARS))

# KTC2023's 28 public cases answered by a small CDEIT (recipes/ktc_demo.sh); the shipped models
# (recipes/cdeit16_model.sh, recipes/ktc_model.sh); a KTC2023 model on the held-out shape
# families (recipes/ktc_heldout.sh); your own device from DEVICE=ref.mat into RUN
# (recipes/device_model.sh, docs/your_device.md).
ktc-demo: install
	@$(call recipe,ktc_demo.sh,KTC_DATA KTC_RUN)
cdeit16-model: install
	@$(call recipe,cdeit16_model.sh,CDEIT16_DATA CDEIT16_CLASS_DATA CDEIT16_FOREIGN CDEIT16_CALIB CDEIT16_BASE \
	  CDEIT16_FINE CDEIT16_RUN CDEIT16_ALPHA CDEIT16_EVAL CDEIT16_SIM)
ktc-model: install
	@$(call recipe,ktc_model.sh,KTC_MODEL_DATA KTC_MODEL_DRIFT_DATA KTC_MODEL_BASE KTC_MODEL_FINE \
	  KTC_MODEL_ALPHA KTC_MODEL_RUN KTC_MODEL_SIM KTC_HELD)
ktc-heldout: install
	@$(call recipe,ktc_heldout.sh,KTC_HELD KTC_HELD_MODEL KTC_HELD_OUT KTC_HELD_RULES)
device-model: install
	@$(call recipe,device_model.sh,DEVICE RUN CALIBRATE WIDTH_DEG ELECTRODE_CM TANK_CM \
	  DEVICE_PATH DEVICE_CONFIG TRAIN)

# One command proves an accelerator (GPU, TPU, or this CPU with a small model): train step,
# bfloat16 numerics, sampling, reconstruction and an exact resume, into $(OUT)/accelerator_check.json
# (python -m cdeit_jax.accelerator_check; docs/gpu.md). Exits 1 when a section fails or a
# bar is missed.
OUT ?= runs/accelerator_check
accelerator-check: install
	$(BIN)/python -m cdeit_jax.accelerator_check --out $(OUT) $(CHECK_ARGS)

# One prepared command for a lent GPU (python -m cdeit_jax.gpu_run, docs/gpu.md), in at most 9 minutes:
# the accelerator check at the published size, ours beside the published PyTorch code on the same
# chip (REFERENCE: a copy of it, `make gpu-reference REF=PATH`: recipes/gpu_reference.sh), a
# KTC2023 model trained on fresh simulations for the rest of the time and exported as one file,
# into OUT (at most 8 flat files). On a CPU it rehearses every stage at a tiny size (about 5
# minutes). On the lent machine (its own Python, no network, no .venv) give WHEELS=wheels: the
# wheels `make gpu-wheels` put there (recipes/gpu_wheels.sh) are installed beside that Python
# instead of making .venv (recipes/gpu_run.sh, which also runs without make).
GPU_OUT = $(if $(filter command line,$(origin OUT)),$(OUT),runs/gpu_run)
REFERENCE ?= reference/CDEIT
GPU_FLAGS = --reference $(REFERENCE) $(GPU_ARGS)
WHEELS ?=
gpu-run:
ifneq ($(WHEELS),)
	WHEELS=$(WHEELS) bash recipes/gpu_run.sh $(GPU_OUT) $(GPU_FLAGS)
else
	@$(MAKE) -s install
	$(BIN)/python -m cdeit_jax.gpu_run --out $(GPU_OUT) $(GPU_FLAGS)
endif
gpu-reference:
	@$(call recipe,gpu_reference.sh,REF)
gpu-wheels: install
	@$(call recipe,gpu_wheels.sh,GPU_WHEELS)

train-test: install
	$(BIN)/python train.py --config configs/test.py --workdir runs/test

# docs/config.md, every config key explained, from cdeit_jax/config_lib.py (KEYS, SECTIONS);
# tests/test_config_docs.py keeps the two equal.
config-docs: install
	$(BIN)/python -c 'from cdeit_jax import config_lib; print(config_lib.markdown(), end="")' \
	  > docs/config.md

bench: install
	$(BIN)/python bench/bench_model.py
	@test -d $(DEMO_RUN)/checkpoints && $(BIN)/python bench/bench_reconstruct.py \
	  --workdir $(DEMO_RUN) --skip-published || echo "bench_reconstruct: make demo-model first"

clean:
	rm -rf $(VENV) *.egg-info
