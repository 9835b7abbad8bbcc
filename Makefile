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
MODEL_DIR ?= models/default
# What the worker serves on CPU: the exported (Paddle Inference + oneDNN) form of MODEL_DIR.
STATIC_MODEL_DIR ?= $(MODEL_DIR)-static
PYTEST_ARGS ?=

.PHONY: help install browser kafka-up kafka-down kafka-status train model demo test test-unit test-faults lint typecheck schemas clean

help:
	@echo "make demo        broker up, default model trained if missing, sample reviews labelled, table printed"
	@echo "make test        install, throw-away broker up, full test suite, broker down"
	@echo "make test-unit   the tests that need neither broker nor trained model"
	@echo "make browser     Debian's chromium + chromium-driver (+ a CJK font) for the page test (root)"
	@echo "make kafka-up / kafka-down / kafka-status   the local Apache Kafka broker on localhost:$(KAFKA_PORT)"
	@echo "make train       (re)train the default model into $(MODEL_DIR) (~10 min on 2 CPU cores)"
	@echo "make model       train if missing, then export it to $(STATIC_MODEL_DIR) (what the demo serves)"
	@echo "make lint / typecheck / schemas"

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

kafka-up: install
	$(LAUNCHER) up --port $(KAFKA_PORT)

kafka-down:
	@test -x $(PY) && $(LAUNCHER) down --port $(KAFKA_PORT) || true

kafka-status: install
	$(LAUNCHER) status --port $(KAFKA_PORT)

$(MODEL_DIR)/metrics.json: | $(VENV)/.installed
	$(CLI) train --output-dir $(MODEL_DIR)

$(STATIC_MODEL_DIR)/sentiment_model.json: $(MODEL_DIR)/metrics.json
	$(CLI) export --model $(MODEL_DIR) --output-dir $(STATIC_MODEL_DIR) --overwrite

model: $(STATIC_MODEL_DIR)/sentiment_model.json

train: install
	$(CLI) train --output-dir $(MODEL_DIR)

demo: install kafka-up model
	@bash deploy/demo.sh $(STATIC_MODEL_DIR) localhost:$(KAFKA_PORT) $(MODEL_DIR)

test: install browser lint typecheck
	@rm -rf $(TEST_KAFKA_DIR)
	$(LAUNCHER) up --port $(TEST_KAFKA_PORT) --data-dir $(TEST_KAFKA_DIR)
	@set +e; KAFKA_BOOTSTRAP_SERVERS=localhost:$(TEST_KAFKA_PORT) $(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
		$(LAUNCHER) down --data-dir $(TEST_KAFKA_DIR); exit $$rc

test-unit: install
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-faults: install
	$(PY) -m pytest tests/faults $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check worker schemas tests deploy
	$(VENV)/bin/ruff format --check worker schemas tests deploy

typecheck: install
	$(VENV)/bin/mypy

schemas: install
	$(PY) -m schemas.export

clean:
	rm -rf var build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
