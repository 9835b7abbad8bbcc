# sentiment-worker: `make demo` and `make test` are the two commands a fresh machine needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CLI := $(VENV)/bin/sentiment-worker
LAUNCHER := $(PY) deploy/kafka/launcher.py

KAFKA_PORT ?= 9092
# The test suite gets its own throw-away broker, so it never touches the one `make demo` uses.
TEST_KAFKA_PORT ?= 19092
TEST_KAFKA_DIR := var/kafka-test
# The default model ships in the repository (models/default/README.md: base, data, recipe, held-out metrics).
MODEL_DIR ?= models/default
# What the worker serves on CPU: the exported (Paddle Inference + oneDNN) form of MODEL_DIR.
STATIC_MODEL_DIR ?= $(MODEL_DIR)-static
# `make default-model` rebuilds it: teacher (bge-small-zh fine-tuned) → distilled student → promotion gate.
TEACHER_DIR ?= models/teacher
CANDIDATE_DIR ?= models/candidate
SCRATCH_DIR ?= models/scratch
# 1 epoch is the shipped default's recipe; TEACHER_EPOCHS=2 gives the best teacher measured (87.79 % held-out).
TEACHER_EPOCHS ?= 1
TEACHER_FLAGS ?= --init bge-small-zh --epochs $(TEACHER_EPOCHS) --batch-size 32 --learning-rate 1e-4 --warmup-fraction 0.1 \
	--max-seq-len 128 --truncation head_tail --checkpoint-every 100 --name sentiment-bge-small-zh-teacher
STUDENT_FLAGS ?= --teacher $(TEACHER_DIR) --num-layers 3 --hidden-size 128 --num-heads 4 --intermediate-size 512 \
	--max-seq-len 128 --truncation head_tail --epochs 3 --learning-rate 1e-3 --augment-copies 2 \
	--temperature 2 --soft-weight 0.9 --name sentiment-bge-student-3x128
# Allowed loss of the candidate against the current default (accuracy and macro-F1) before it replaces it.
PROMOTION_MARGIN ?= 0.005
PYTEST_ARGS ?=

.PHONY: help install browser prometheus-tools kafka-up kafka-down kafka-status base-model teacher candidate default-model \
	scratch-model model-table model demo test test-unit test-faults lint typecheck schemas docs clean

help:
	@echo "make demo        broker up, the shipped default model exported, sample reviews labelled, table printed"
	@echo "make test        install, throw-away broker up, full test suite, broker down"
	@echo "make test-unit   the tests that need neither broker nor trained model"
	@echo "make browser     Debian's chromium + chromium-driver (+ a CJK font) for the page test (root)"
	@echo "make prometheus-tools  Debian's prometheus package (promtool) for the alert-rule tests (root)"
	@echo "make kafka-up / kafka-down / kafka-status   the local Apache Kafka broker on localhost:$(KAFKA_PORT)"
	@echo "make base-model  fetch bge-small-zh-v1.5 (Maven) and convert it for \`train --init bge-small-zh\`"
	@echo "make model       export the shipped default model to $(STATIC_MODEL_DIR) (what the demo serves)"
	@echo "make default-model  rebuild it: teacher (~36 min on 2 cores), student (~26 min), promotion gate"
	@echo "make scratch-model  the from-scratch 2x128 model (no pretrained base) into $(SCRATCH_DIR) (~12 min)"
	@echo "make model-table  the README's model table: the default and whichever of $(SCRATCH_DIR), $(TEACHER_DIR) exist"
	@echo "make lint / typecheck / schemas"
	@echo "make docs        regenerate docs/settings.md and the README's settings table from worker/config.py"

$(VENV)/.installed: pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "installing PaddlePaddle, PaddleNLP, confluent-kafka ... (a few minutes the first time)"
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $@

install: $(VENV)/.installed

# The page test (tests/integration/test_serve_page.py) drives Debian's headless chromium through
# chromium-driver; a CJK font makes its screenshot readable. Installed only when missing (CI runs as root).
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null \
		|| ! fc-list 2>/dev/null | grep -qi "wenquanyi"; then \
		echo "installing chromium, chromium-driver and fonts-wqy-zenhei (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			chromium chromium-driver fonts-wqy-zenhei; \
	fi

# The alert-rule tests (tests/unit/test_prometheus_rules.py) run `promtool check config|rules` and
# `promtool test rules`; Debian's prometheus package ships /usr/bin/promtool. Installed only when missing.
# The tests never use the Prometheus server the package may start.
prometheus-tools:
	@if ! command -v promtool >/dev/null; then \
		echo "installing prometheus (apt-get) for promtool"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; \
	fi

kafka-up: install
	$(LAUNCHER) up --port $(KAFKA_PORT)

kafka-down:
	@test -x $(PY) && $(LAUNCHER) down --port $(KAFKA_PORT) || true

kafka-status: install
	$(LAUNCHER) status --port $(KAFKA_PORT)

# ~/.cache/sentiment-worker/base-model/bge-small-zh ($$SENTIMENT_BASE_MODEL_CACHE); a no-op once there.
base-model: install
	$(CLI) base-model

$(MODEL_DIR)/metrics.json:
	@echo "$(MODEL_DIR) is shipped in the repository: restore it (git checkout -- $(MODEL_DIR)) or rebuild it (make default-model)" >&2
	@exit 2

$(STATIC_MODEL_DIR)/sentiment_model.json: $(MODEL_DIR)/metrics.json | $(VENV)/.installed
	$(CLI) export --model $(MODEL_DIR) --output-dir $(STATIC_MODEL_DIR) --overwrite

model: $(STATIC_MODEL_DIR)/sentiment_model.json

teacher: base-model
	$(CLI) train $(TEACHER_FLAGS) --output-dir $(TEACHER_DIR)

candidate: install
	@test -f $(TEACHER_DIR)/metrics.json || { echo "no teacher in $(TEACHER_DIR): make teacher first" >&2; exit 2; }
	$(CLI) train $(STUDENT_FLAGS) --output-dir $(CANDIDATE_DIR)

# The promotion gate: the candidate replaces the default only when it is not worse on the same held-out reviews.
default-model: teacher candidate
	$(CLI) promote --candidate $(CANDIDATE_DIR) --default $(MODEL_DIR) --margin $(PROMOTION_MARGIN)
	rm -rf $(STATIC_MODEL_DIR)

# The README's model table, one run: the shipped default plus the other models that exist here.
model-table: install
	$(CLI) model-table --model $(MODEL_DIR) $(foreach dir,$(SCRATCH_DIR) $(TEACHER_DIR),\
		$(if $(wildcard $(dir)/metrics.json),--model $(dir)))

scratch-model: install
	$(CLI) train --output-dir $(SCRATCH_DIR)

demo: install kafka-up model
	@bash deploy/demo.sh $(STATIC_MODEL_DIR) localhost:$(KAFKA_PORT) $(MODEL_DIR)

test: install browser prometheus-tools lint typecheck
	@rm -rf $(TEST_KAFKA_DIR)
	$(LAUNCHER) up --port $(TEST_KAFKA_PORT) --data-dir $(TEST_KAFKA_DIR)
	@set +e; KAFKA_BOOTSTRAP_SERVERS=localhost:$(TEST_KAFKA_PORT) $(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
		$(LAUNCHER) down --data-dir $(TEST_KAFKA_DIR); exit $$rc

test-unit: install prometheus-tools
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-faults: install
	$(PY) -m pytest tests/faults $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check worker schemas tests deploy docs
	$(VENV)/bin/ruff format --check worker schemas tests deploy docs

typecheck: install
	$(VENV)/bin/mypy

schemas: install
	$(PY) -m schemas.export

# The settings reference (docs/settings.md, the README's short table); tests/unit/test_settings_doc.py fails when stale.
docs: install
	$(PY) docs/settings_table.py

clean:
	rm -rf var build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
