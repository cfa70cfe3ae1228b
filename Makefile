# Everything installs into .venv (Python 3.11+); `make test` is the README's test command.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install lint test test-e2e test-all accelerator-check gpu-run gpu-reference gpu-wheels demo demo-model \
  ktc-demo ktc-model ktc-heldout \
  cdeit16-model device-model moving-demo train-test bench clean

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

# The embedded default: simulate a training set once (cached), whose measuring system is drawn per
# example (config.simulator.system), and a foreign system's test set (configs/foreign.py); train
# the small physics-informed CDEIT of configs/demo.py on 2 CPU cores; fit the uncertainty scale
# on the validation split; evaluate it (mean of 8 samples) on held-out simulations, the foreign
# system and the real UEF2017 tank cases beside Tikhonov and the empty image; print the table.
DEMO_DATA ?= $(HOME)/.cache/cdeit-jax/demo-sim-v3
DEMO_FOREIGN ?= $(HOME)/.cache/cdeit-jax/demo-foreign-v1
DEMO_RUN ?= runs/demo
DEMO_EVAL = --config.eval.tikhonov=True --config.sampling.num_samples=8
demo: demo-model
	@start=$$(date +%s) && \
	$(BIN)/python eval.py --workdir $(DEMO_RUN) --data simulated --data_path $(DEMO_DATA)/valid \
	  --out $(DEMO_RUN)/eval_valid $(DEMO_EVAL) --config.eval.fit_uncertainty=True \
	  --config.eval.figure=False && \
	$(BIN)/python eval.py --workdir $(DEMO_RUN) --data simulated --data_path $(DEMO_DATA)/test \
	  --out $(DEMO_RUN)/eval_simulated $(DEMO_EVAL) && \
	$(BIN)/python eval.py --workdir $(DEMO_RUN) --data simulated --data_path $(DEMO_FOREIGN)/test \
	  --out $(DEMO_RUN)/eval_foreign $(DEMO_EVAL) && \
	$(BIN)/python eval.py --workdir $(DEMO_RUN) --data uef2017 --data_path data/uef2017 \
	  --out $(DEMO_RUN)/eval_uef2017 $(DEMO_EVAL) && \
	$(BIN)/python -m cdeit_jax.report $(DEMO_RUN)/eval_simulated $(DEMO_RUN)/eval_foreign \
	  $(DEMO_RUN)/eval_uef2017 && \
	echo "make demo: evaluations $$(( $$(date +%s) - start )) s (figures: $(DEMO_RUN)/eval_*/reconstructions.png)"

# The demo model: its training set (cached), the foreign system's test set, the training run
# (rerunning resumes, or finds it finished).
demo-model: install
	@start=$$(date +%s) && \
	$(BIN)/python -m cdeit_jax.simulate --out $(DEMO_DATA) --num_train 3000 --num_valid 64 \
	  --num_test 64 --tr_splits valid,test && \
	$(BIN)/python -m cdeit_jax.simulate --config configs/foreign.py --out $(DEMO_FOREIGN) \
	  --num_test 64 && \
	$(BIN)/python train.py --config configs/demo.py --workdir $(DEMO_RUN) \
	  --config.data.path=$(DEMO_DATA) && \
	echo "make demo-model: $$(( $$(date +%s) - start )) s"

# KTC2023's system (32 electrodes, 76 patterns, the levels' removed electrodes): simulate its
# training set once (cached), train the small CDEIT of configs/ktc2023.py on 2 CPU cores (each
# example loses one level's electrodes), answer the 28 public cases as the challenge asks and
# print the score per level beside the in-tool Tikhonov and all water (docs/ktc2023.md).
KTC_DATA ?= $(HOME)/.cache/cdeit-jax/ktc-sim-v2
KTC_RUN ?= runs/ktc2023
ktc-demo: install
	@start=$$(date +%s) && \
	$(BIN)/python -m cdeit_jax.simulate --config configs/ktc2023.py --out $(KTC_DATA) \
	  --num_train 3000 --num_valid 64 --num_test 64 --tr_splits valid,test && \
	$(BIN)/python train.py --config configs/ktc2023.py --workdir $(KTC_RUN) \
	  --config.data.path=$(KTC_DATA) && \
	$(BIN)/python eval.py --workdir $(KTC_RUN) --data ktc2023_challenge \
	  --data_path data/ktc2023/levels --out $(KTC_RUN)/eval_ktc2023 --config.eval.tikhonov=True && \
	echo "make ktc-demo: $$(( $$(date +%s) - start )) s (answers: $(KTC_RUN)/eval_ktc2023)"

# The model that ships for CDEIT's 16-electrode system (models/cdeit16, docs/checkpoints.md):
# simulate 24,000 training examples once (cached), twice: with label targets and with class
# targets (the same voltages); train configs/cdeit16.py 30,000 steps on the labels, fine-tune it
# 4,000 steps on the classes (configs/cdeit16_class.py), and take the weights half-way between
# the two (WiSE-FT, python -m cdeit_jax.tools.interpolate; rerunning resumes each stage);
# fit the uncertainty scale, evaluate on held-out simulations, the foreign system and UEF2017,
# and write the model folder with those scores (python -m cdeit_jax.ship).
CDEIT16_DATA ?= $(HOME)/.cache/cdeit-jax/cdeit16-sim-v1
CDEIT16_CLASS_DATA ?= $(HOME)/.cache/cdeit-jax/cdeit16-sim-class-v1
CDEIT16_FOREIGN ?= $(HOME)/.cache/cdeit-jax/demo-foreign-class-v1
CDEIT16_BASE ?= runs/cdeit16
CDEIT16_FINE ?= runs/cdeit16_class
CDEIT16_RUN ?= runs/cdeit16_wise
CDEIT16_ALPHA ?= 0.5
CDEIT16_EVAL = --config.eval.tikhonov=True --config.eval.figure=False
CDEIT16_SIM = --num_train 24000 --num_valid 256 --num_test 64 --tr_splits valid,test
cdeit16-model: install
	@start=$$(date +%s) && \
	$(BIN)/python -m cdeit_jax.simulate --out $(CDEIT16_DATA) $(CDEIT16_SIM) && \
	$(BIN)/python -m cdeit_jax.simulate --out $(CDEIT16_CLASS_DATA) $(CDEIT16_SIM) \
	  --config.simulator.phantom.target=class && \
	$(BIN)/python -m cdeit_jax.simulate --config configs/foreign.py --out $(CDEIT16_FOREIGN) \
	  --num_test 64 --config.simulator.phantom.target=class && \
	$(BIN)/python train.py --config configs/cdeit16.py --workdir $(CDEIT16_BASE) \
	  --config.data.path=$(CDEIT16_DATA) && \
	$(BIN)/python train.py --config configs/cdeit16_class.py --workdir $(CDEIT16_FINE) \
	  --config.data.path=$(CDEIT16_CLASS_DATA) --config.init_from=$(CDEIT16_BASE) && \
	$(BIN)/python -m cdeit_jax.tools.interpolate --workdir $(CDEIT16_FINE) \
	  --alpha $(CDEIT16_ALPHA) --out $(CDEIT16_RUN) && \
	$(BIN)/python eval.py --workdir $(CDEIT16_RUN) --data simulated \
	  --data_path $(CDEIT16_CLASS_DATA)/valid --out $(CDEIT16_RUN)/eval_valid $(CDEIT16_EVAL) \
	  --config.eval.fit_uncertainty=True && \
	$(BIN)/python eval.py --workdir $(CDEIT16_RUN) --data simulated \
	  --data_path $(CDEIT16_CLASS_DATA)/test --out $(CDEIT16_RUN)/eval_simulated $(CDEIT16_EVAL) && \
	$(BIN)/python eval.py --workdir $(CDEIT16_RUN) --data simulated \
	  --data_path $(CDEIT16_FOREIGN)/test --out $(CDEIT16_RUN)/eval_foreign $(CDEIT16_EVAL) && \
	$(BIN)/python eval.py --workdir $(CDEIT16_RUN) --data uef2017 --data_path data/uef2017 \
	  --out $(CDEIT16_RUN)/eval_uef2017 $(CDEIT16_EVAL) && \
	$(BIN)/python -m cdeit_jax.report $(CDEIT16_RUN)/eval_simulated $(CDEIT16_RUN)/eval_foreign \
	  $(CDEIT16_RUN)/eval_uef2017 && \
	$(BIN)/python -m cdeit_jax.ship --workdir $(CDEIT16_RUN) --out models/cdeit16 \
	  --recipe "make cdeit16-model (configs/cdeit16.py, configs/cdeit16_class.py, WiSE-FT $(CDEIT16_ALPHA))" \
	  --scores simulated=$(CDEIT16_RUN)/eval_simulated/metrics.json \
	  --scores foreign=$(CDEIT16_RUN)/eval_foreign/metrics.json \
	  --scores uef2017=$(CDEIT16_RUN)/eval_uef2017/metrics.json && \
	echo "make cdeit16-model: $$(( $$(date +%s) - start )) s (the model: models/cdeit16)"

# The model that ships for KTC2023's device (models/ktc2023; configs/ktc2023_model.py, then
# configs/ktc2023_model_drift.py): simulate 24,000 training examples with challenge-like phantoms
# and the measuring system drawn around the calibrated device, and the same with the target frame
# drifting against the empty tank's (both cached; a cached folder with fewer is extended); train
# the segmenter (about 110 min on 2 cores), fine-tune it on the drifting frames (about 15 min;
# rerunning either resumes) and take the point KTC_MODEL_ALPHA along the line between the two
# (WiSE-FT; 1, the fine-tuned weights, is what the validation simulations chose: docs/ktc2023.md);
# choose the answer rule on the validation simulations at every level (python -m
# cdeit_jax.tools.answer_study; the public 28 beside), score it on both test splits and the
# held-out families, answer the public cases with it, and write the model folder with the rule
# and scores.
KTC_MODEL_DATA ?= $(HOME)/.cache/cdeit-jax/ktc-model-sim-v1
KTC_MODEL_DRIFT_DATA ?= $(HOME)/.cache/cdeit-jax/ktc-model-sim-drift-v1
KTC_MODEL_BASE ?= runs/ktc2023_model
KTC_MODEL_FINE ?= runs/ktc2023_model_drift
KTC_MODEL_ALPHA ?= 1
KTC_MODEL_RUN ?= runs/ktc2023_model_wise
KTC_MODEL_SIM = --num_train 24000 --num_valid 256 --num_test 256 --tr_splits valid,test
ktc-model: install
	@start=$$(date +%s) && \
	$(BIN)/python -m cdeit_jax.simulate --config configs/ktc2023_model.py --out $(KTC_MODEL_DATA) \
	  $(KTC_MODEL_SIM) && \
	$(BIN)/python -m cdeit_jax.simulate --config configs/ktc2023_model_drift.py \
	  --out $(KTC_MODEL_DRIFT_DATA) $(KTC_MODEL_SIM) && \
	$(BIN)/python train.py --config configs/ktc2023_model.py --workdir $(KTC_MODEL_BASE) \
	  --config.data.path=$(KTC_MODEL_DATA) && \
	$(BIN)/python train.py --config configs/ktc2023_model_drift.py --workdir $(KTC_MODEL_FINE) \
	  --config.data.path=$(KTC_MODEL_DRIFT_DATA) --config.init_from=$(KTC_MODEL_BASE) && \
	$(BIN)/python -m cdeit_jax.tools.interpolate --workdir $(KTC_MODEL_FINE) \
	  --alpha $(KTC_MODEL_ALPHA) --out $(KTC_MODEL_RUN) && \
	$(BIN)/python -m cdeit_jax.tools.answer_study --workdir $(KTC_MODEL_RUN) \
	  --sims $(KTC_MODEL_DATA)/valid,$(KTC_MODEL_DRIFT_DATA)/valid --ktc data/ktc2023/levels \
	  --out $(KTC_MODEL_RUN)/answer_study.json && \
	rule=$$($(BIN)/python -c "import json; print(json.load(open('$(KTC_MODEL_RUN)/answer_study.json'))['metrics']['chosen'])") && \
	$(BIN)/python -m cdeit_jax.tools.answer_study --workdir $(KTC_MODEL_RUN) --rules $$rule \
	  --sims $(KTC_MODEL_DATA)/test --out $(KTC_MODEL_RUN)/answer_test.json && \
	$(BIN)/python -m cdeit_jax.tools.answer_study --workdir $(KTC_MODEL_RUN) --rules $$rule \
	  --sims $(KTC_MODEL_DRIFT_DATA)/test --out $(KTC_MODEL_RUN)/answer_test_drift.json && \
	$(call ktc_heldout,$(KTC_MODEL_RUN),$(KTC_MODEL_RUN),$$rule) && \
	$(BIN)/python eval.py --workdir $(KTC_MODEL_RUN) --data ktc2023_challenge \
	  --data_path data/ktc2023/levels --out $(KTC_MODEL_RUN)/eval_ktc2023 \
	  --config.eval.tikhonov=True --config.eval.answer_rule=$$rule && \
	$(BIN)/python -m cdeit_jax.ship --workdir $(KTC_MODEL_RUN) --out models/ktc2023 \
	  --recipe "make ktc-model (configs/ktc2023_model.py, configs/ktc2023_model_drift.py, WiSE-FT $(KTC_MODEL_ALPHA))" \
	  --set eval.answer_rule=$$rule \
	  --scores ktc2023_public=$(KTC_MODEL_RUN)/eval_ktc2023/metrics.json \
	  --scores rule_study=$(KTC_MODEL_RUN)/answer_study.json \
	  --scores simulated_levels=$(KTC_MODEL_RUN)/answer_test.json \
	  --scores simulated_levels_drift=$(KTC_MODEL_RUN)/answer_test_drift.json \
	  --scores heldout_few=$(KTC_MODEL_RUN)/heldout_few.json \
	  --scores heldout_many=$(KTC_MODEL_RUN)/heldout_many.json && \
	echo "make ktc-model: $$(( $$(date +%s) - start )) s (the model: models/ktc2023, rule $$rule)"

# A KTC2023 model on the held-out shape families (docs/ktc2023.md): targets of shapes its
# training never draws (letters, blobs, thin shapes, concave outlines, touching pairs), made once
# (cached) for configs/ktc2023_model.py's system, 100 with 1-4 objects (few/: levels 1-4) and 100
# with 3-4 of both classes (many/: levels 5-7), scored per level for the model's answer rules
# (KTC_HELD_RULES: one rule; default: every candidate) into KTC_HELD_OUT/heldout_{few,many}.json.
# A test: nothing is chosen on it.
KTC_HELD ?= $(HOME)/.cache/cdeit-jax/ktc-heldout-v1
KTC_HELD_MODEL ?= models/ktc2023
KTC_HELD_OUT ?= runs/ktc2023_heldout
KTC_HELD_RULES ?=
# $(call ktc_heldout,MODEL,OUT,RULES): the families made once, then both groups scored (a
# canned command, not a recursive make: `make -n ktc-model` would run one)
ktc_heldout = { test -f $(KTC_HELD)/heldout.json || $(BIN)/python -m cdeit_jax.tools.heldout_families \
	  --config configs/ktc2023_model.py --out $(KTC_HELD) --num 100; } && mkdir -p $(2) && \
	for group in few many; do \
	  $(BIN)/python -m cdeit_jax.tools.answer_study --workdir $(1) --sims $(KTC_HELD)/$$group \
	    --num 100 $(if $(3),--rules $(3)) --out $(2)/heldout_$$group.json || exit 1; \
	done
ktc-heldout: install
	@start=$$(date +%s) && \
	$(call ktc_heldout,$(KTC_HELD_MODEL),$(KTC_HELD_OUT),$(KTC_HELD_RULES)) && \
	echo "make ktc-heldout: $$(( $$(date +%s) - start )) s (levels 1-4: $(KTC_HELD_OUT)/heldout_few.json, 5-7: heldout_many.json)"

# Your own device (docs/your_device.md): calibrate it from its reference file (gain, contact
# impedance and electrode width fitted to the empty tank, each with the range the frame allows;
# WIDTH_DEG=10.2, or ELECTRODE_CM=2.5 TANK_CM=28, holds a width you know; CALIBRATE: more
# flags, e.g. --patterns 0-15), simulate its training set with the measuring system drawn
# across the calibration's ranges, and fine-tune models/cdeit16 for it (configs/device.py;
# DEVICE_CONFIG=configs/device_scratch.py trains from random weights; TRAIN: more train.py
# flags, e.g. --config.model.current_carrying=use) into RUN; rerunning resumes. Then: python -m cdeit_jax.reconstruct --workdir RUN --frames F --reference REF --out O
DEVICE ?=
RUN ?= runs/device
CALIBRATE ?=
WIDTH_DEG ?=
ELECTRODE_CM ?=
TANK_CM ?=
DEVICE_CONFIG ?= configs/device.py
TRAIN ?=
device-model: install
	@test -n "$(DEVICE)" || { echo "make device-model: give DEVICE=ref.mat (the device's reference file)"; exit 2; }
	@start=$$(date +%s) && \
	$(BIN)/python -m cdeit_jax.calibrate --device $(DEVICE) --out $(RUN)/device.npz \
	  $(if $(WIDTH_DEG),--width_deg $(WIDTH_DEG)) $(if $(ELECTRODE_CM),--electrode_cm $(ELECTRODE_CM)) \
	  $(if $(TANK_CM),--tank_cm $(TANK_CM)) $(CALIBRATE) && \
	$(BIN)/python -m cdeit_jax.simulate --config $(DEVICE_CONFIG):$(RUN)/device.npz \
	  --out $(RUN)/data --num_train 3000 --num_valid 64 --num_test 64 --tr_splits valid,test && \
	$(BIN)/python train.py --config $(DEVICE_CONFIG):$(RUN)/device.npz --workdir $(RUN) \
	  --config.data.path=$(RUN)/data $(TRAIN) && \
	echo "make device-model: $$(( $$(date +%s) - start )) s (the model: $(RUN))"

# A moving sequence as a device records it (a reference frame, then 90 frames: two lung-like
# regions filling and emptying, a conductive disc going round the wall and across the centre),
# reconstructed by the demo model (trained first if there is none) into frames.npz/.mat, a
# montage and the GIF shown in the README (docs/moving_demo.gif).
MOVING ?= $(DEMO_RUN)/moving
moving-demo: install
	@test -d $(DEMO_RUN)/checkpoints || $(MAKE) demo-model
	$(BIN)/python -m cdeit_jax.sequence --out $(MOVING)/sequence.npz
	$(BIN)/python -m cdeit_jax.reconstruct --workdir $(DEMO_RUN) --frames $(MOVING)/sequence.npz \
	  --out $(MOVING) --config.sampling.num_samples=4
	@echo "make moving-demo: $(MOVING)/frames.gif, $(MOVING)/montage.png"

# One command proves an accelerator (GPU, TPU, or this CPU with a small model): train step,
# bfloat16 numerics, sampling, reconstruction and an exact resume, into $(OUT)/accelerator_check.json
# (python -m cdeit_jax.tools.accelerator_check; docs/gpu.md). Exits 1 when a section fails or a bar is missed.
OUT ?= runs/accelerator_check
accelerator-check: install
	$(BIN)/python -m cdeit_jax.tools.accelerator_check --out $(OUT) $(CHECK_ARGS)

# One prepared command for a lent GPU (recipes/gpu_run.py, docs/gpu.md), in at most 9 minutes:
# the accelerator check at the published size, ours beside the published PyTorch code on the same
# chip (REFERENCE: a copy of it, `make gpu-reference`), a KTC2023 model trained on fresh
# simulations for the rest of the time and exported as one file, into OUT (at most 8 flat
# files). On a CPU it rehearses every stage at a tiny size (about 5 minutes). On the lent machine
# (its own Python, no network, no .venv) give WHEELS=wheels: the wheels `make gpu-wheels` put
# there are installed beside that Python instead of making .venv (recipes/gpu_run.sh, which
# also runs without make).
GPU_OUT = $(if $(filter command line,$(origin OUT)),$(OUT),runs/gpu_run)
REFERENCE ?= reference/CDEIT
GPU_FLAGS = --reference $(REFERENCE) $(GPU_ARGS)
WHEELS ?=
gpu-run:
ifneq ($(WHEELS),)
	WHEELS=$(WHEELS) bash recipes/gpu_run.sh $(GPU_OUT) $(GPU_FLAGS)
else
	@$(MAKE) -s install
	$(BIN)/python recipes/gpu_run.py --out $(GPU_OUT) $(GPU_FLAGS)
endif

# The published code for gpu-run's side-by-side stage, copied from a checkout of
# github.com/shuaikaishi/CDEIT (REF=PATH) into reference/CDEIT: git-ignored, so it travels with
# the working tree to a lent machine and is never committed.
REF ?=
gpu-reference:
	@test -f "$(REF)/models.py" || { echo "make gpu-reference: give REF=PATH, a checkout of the published CDEIT code (models.py, diffusion/)"; exit 2; }
	rm -rf reference/CDEIT && mkdir -p reference/CDEIT && cp -r $(REF)/models.py $(REF)/diffusion reference/CDEIT/

# The wheels a lent GPU machine lacks (Python 3.12, no network there; docs/gpu.md), into wheels/
# (git-ignored): carry it, then there: pip install --no-index --no-deps wheels/*.whl. Not
# protobuf or PyYAML: orbax-checkpoint and flax bring them (a second copy could clobber theirs).
GPU_WHEELS = grain array_record cloudpickle portpicker psutil ml_collections tensorboardX tqdm
gpu-wheels: install
	$(BIN)/pip download -q --only-binary=:all: --no-deps --python-version 3.12 -d wheels \
	  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 $(GPU_WHEELS)
	@du -sh wheels

train-test: install
	$(BIN)/python train.py --config configs/test.py --workdir runs/test

bench: install
	$(BIN)/python bench/bench_model.py
	@test -d $(DEMO_RUN)/checkpoints && $(BIN)/python bench/bench_reconstruct.py \
	  --workdir $(DEMO_RUN) --skip-published || echo "bench_reconstruct: make demo-model first"

clean:
	rm -rf $(VENV) *.egg-info
