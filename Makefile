# sentiment-worker: `make demo` and `make test` are the two commands a fresh machine needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CLI := $(VENV)/bin/sentiment-worker
LAUNCHER := $(PY) deploy/kafka/launcher.py
REGISTRY_LAUNCHER := $(PY) deploy/registry/launcher.py

KAFKA_PORT ?= 9092
# The test suite gets its own throw-away broker, so it never touches the one `make demo` uses.
TEST_KAFKA_PORT ?= 19092
TEST_KAFKA_DIR := var/kafka-test
# A schema registry with Confluent's REST API (Apicurio, deploy/registry): `make registry-up` on REGISTRY_PORT,
# and a throw-away one for the test suite (SCHEMA_REGISTRY_URL), like the broker.
REGISTRY_PORT ?= 8081
TEST_REGISTRY_PORT ?= 18081
TEST_REGISTRY_DIR := var/registry-test
# `make kafka-up-secure`: TLS + ACLs (docs/security.md); SSL on port+3, SASL_SSL on port+4.
SECURE_KAFKA_DIR := var/kafka-secure
SECURE_SSL_PORT := $(shell echo $$(($(KAFKA_PORT) + 3)))
SECURE_ADMIN_ENV := SENTIMENT_BOOTSTRAP_SERVERS=localhost:$(SECURE_SSL_PORT) SENTIMENT_SECURITY_PROTOCOL=SSL \
	SENTIMENT_SSL_CA_LOCATION=$(SECURE_KAFKA_DIR)/tls/ca.pem SENTIMENT_SSL_CERTIFICATE_LOCATION=$(SECURE_KAFKA_DIR)/tls/admin.pem \
	SENTIMENT_SSL_KEY_LOCATION=$(SECURE_KAFKA_DIR)/tls/admin.key
# Two models ship in the repository, each with its card (README.md: base, data, recipe, held-out metrics):
# models/default, the accurate one (bge-small-zh fine-tuned, 4 x 512), and models/fast, its 3 x 128 student.
MODEL_DIR ?= models/default
FAST_MODEL_DIR ?= models/fast
# What the worker serves on CPU, derived here in minutes: both models as ONNX Runtime INT8 with fixed, calibrated
# activation scales (`make model`, `make fast-model-int8`; measured fastest on CPU at no held-out loss:
# `make model-table`; a review's label does not depend on its batch-mates: `make batch-invariance`). Paddle Inference
# exports (`make model-static`, `make fast-model-static`) serve GPUs (fp16, TensorRT).
# Each form sits beside its model, named by suffix (the rules below derive it from the name).
ONNX_MODEL_DIR = $(MODEL_DIR)-onnx
SERVED_MODEL_DIR = $(MODEL_DIR)-int8
STATIC_MODEL_DIR = $(MODEL_DIR)-static
FAST_STATIC_MODEL_DIR = $(FAST_MODEL_DIR)-static
FAST_ONNX_MODEL_DIR = $(FAST_MODEL_DIR)-onnx
FAST_SERVED_MODEL_DIR = $(FAST_MODEL_DIR)-int8
# `make default-model` rebuilds the default (teacher, promotion gate); `make fast-model` its student.
TEACHER_DIR ?= models/teacher
CANDIDATE_DIR ?= models/candidate
SCRATCH_DIR ?= models/scratch
# The shipped default's recipe: 2 epochs at lr 1e-4, dev evaluated every 100 steps, the weights of the 3 best
# evaluations averaged when that is not worse on dev (label smoothing 0.1 was tried: not better).
TEACHER_EPOCHS ?= 2
TEACHER_FLAGS ?= --init bge-small-zh --epochs $(TEACHER_EPOCHS) --batch-size 32 --learning-rate 1e-4 --warmup-fraction 0.1 \
	--max-seq-len 128 --truncation head_tail --checkpoint-every 100 --eval-every 100 --average-best 3 \
	--name sentiment-bge-small-zh
STUDENT_FLAGS ?= --teacher $(MODEL_DIR) --num-layers 3 --hidden-size 128 --num-heads 4 --intermediate-size 512 \
	--max-seq-len 128 --truncation head_tail --epochs 3 --learning-rate 1e-3 --augment-copies 2 \
	--temperature 2 --soft-weight 0.9 --layer-weight 1.0 --name sentiment-bge-student-3x128
# Allowed loss of the candidate against the current default (accuracy and macro-F1) before it replaces it.
PROMOTION_MARGIN ?= 0.005
PYTEST_ARGS ?=

.PHONY: help install browser prometheus-tools kafka-up kafka-down kafka-status kafka-up-secure kafka-down-secure \
	registry-up registry-down registry-status base-model teacher candidate \
	default-model fast-model scratch-model model-table batch-invariance model model-static fast-model-static fast-model-int8 adapt-study demo \
	test test-unit \
	test-faults test-stress mutation lint typecheck schemas docs readme-examples clean

help:
	@echo "make demo        broker up, the shipped default model made INT8, sample reviews labelled, table printed"
	@echo "make test        install, throw-away broker up, full test suite, broker down"
	@echo "make test-unit   the tests that need neither broker nor trained model"
	@echo "make test-stress the suite 3 times in a row beside a CPU hog (STRESS_TESTS=... picks a part)"
	@echo "make mutation    cosmic-ray on the pure logic modules, score per module (MUTATION_MODULES=...; CPU heavy)"
	@echo "make browser     Debian's chromium + chromium-driver (+ a CJK font) for the page test (root)"
	@echo "make prometheus-tools  Debian's prometheus package (promtool, server) for the monitoring tests (root)"
	@echo "make kafka-up / kafka-down / kafka-status   the local Apache Kafka broker on localhost:$(KAFKA_PORT)"
	@echo "make kafka-up-secure / kafka-down-secure    the same with TLS and ACLs (docs/security.md)"
	@echo "make registry-up / registry-down / registry-status   the local schema registry on localhost:$(REGISTRY_PORT)"
	@echo "make base-model  fetch bge-small-zh-v1.5 (Maven) and convert it for \`train --init bge-small-zh\`"
	@echo "make model       the shipped default as ONNX Runtime INT8 in $(SERVED_MODEL_DIR) (what the demo serves)"
	@echo "make fast-model-int8  the fast model as ONNX Runtime INT8 in $(FAST_SERVED_MODEL_DIR) (how it is served on CPU)"
	@echo "make model-static / fast-model-static   Paddle Inference exports of $(MODEL_DIR) / $(FAST_MODEL_DIR)"
	@echo "make default-model  rebuild the default: teacher (1-2 h on 2 cores), promotion gate"
	@echo "make fast-model  rebuild the fast model: student of $(TEACHER_DIR) (~30 min), promotion gate"
	@echo "make scratch-model  the from-scratch 2x128 model (no pretrained base) into $(SCRATCH_DIR) (~12 min)"
	@echo "make model-table  the README's model table: both shipped models and their served forms, one run"
	@echo "make batch-invariance  each served INT8 form labels held-out reviews alone as in mixed batches"
	@echo "make lint / typecheck / schemas"
	@echo "make docs        regenerate docs/settings.md and the README's settings table from worker/config/fields.py"
	@echo "make readme-examples  the README's result and HTTP examples, as the worker and serve produce them"

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
		|| ! fc-list :lang=zh 2>/dev/null | grep -q .; then \
		echo "installing chromium, chromium-driver and fonts-wqy-zenhei (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			chromium chromium-driver fonts-wqy-zenhei; \
	fi

# The alert-rule tests (tests/unit/test_prometheus_rules.py) run `promtool check config|rules` and
# `promtool test rules`; tests/integration/test_prometheus_server.py starts its own `prometheus` server (temporary
# config and data, free port). Debian's prometheus package ships both binaries; installed only when one is
# missing. The tests never use the Prometheus service the package may start.
prometheus-tools:
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then \
		echo "installing prometheus (apt-get) for promtool and the prometheus server"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; \
	fi

kafka-up: install
	$(LAUNCHER) up --port $(KAFKA_PORT)

kafka-down:
	@test -x $(PY) && $(LAUNCHER) down --port $(KAFKA_PORT) || true

kafka-status: install
	@$(LAUNCHER) status --port $(KAFKA_PORT) || { rc=$$?; [ $$rc -eq 3 ] || exit $$rc; echo "start it with: make kafka-up"; }

# The same broker with TLS and ACLs (not beside `kafka-up`: same ports). The worker's SASL password is made
# once into $(SECURE_KAFKA_DIR)/worker.password (mode 0600); the topics and the worker's ACLs (exactly_once,
# a superset of at_least_once's) are created with the admin certificate.
kafka-up-secure: install
	@mkdir -p $(SECURE_KAFKA_DIR) && test -s $(SECURE_KAFKA_DIR)/worker.password || \
		(umask 077; openssl rand -hex 16 > $(SECURE_KAFKA_DIR)/worker.password)
	$(LAUNCHER) up --port $(KAFKA_PORT) --data-dir $(SECURE_KAFKA_DIR) --secure \
		--sasl-user worker:$$(cat $(SECURE_KAFKA_DIR)/worker.password)
	$(SECURE_ADMIN_ENV) $(CLI) topics create
	$(SECURE_ADMIN_ENV) $(CLI) topics acls --principal User:worker --delivery exactly_once --apply
	@echo "worker: SENTIMENT_BOOTSTRAP_SERVERS=localhost:$$(($(KAFKA_PORT) + 4)) SENTIMENT_SECURITY_PROTOCOL=SASL_SSL" \
		"SENTIMENT_SSL_CA_LOCATION=$(SECURE_KAFKA_DIR)/tls/ca.pem SENTIMENT_SASL_MECHANISM=SCRAM-SHA-512" \
		"SENTIMENT_SASL_USERNAME=worker SENTIMENT_SASL_PASSWORD=\$$(cat $(SECURE_KAFKA_DIR)/worker.password)"

kafka-down-secure:
	@test -x $(PY) && $(LAUNCHER) down --data-dir $(SECURE_KAFKA_DIR) || true

# Apicurio Registry (deploy/registry/README.md): the first `registry-up` fetches it from Maven Central; its schemas
# stay in var/registry-<port> across restarts. Clients: http://localhost:$(REGISTRY_PORT)/apis/ccompat/v7
registry-up: install
	$(REGISTRY_LAUNCHER) up --port $(REGISTRY_PORT)

registry-down:
	@test -x $(PY) && $(REGISTRY_LAUNCHER) down --port $(REGISTRY_PORT) || true

registry-status: install
	@$(REGISTRY_LAUNCHER) status --port $(REGISTRY_PORT) || { rc=$$?; [ $$rc -eq 3 ] || exit $$rc; echo "start it with: make registry-up"; }

# ~/.cache/sentiment-worker/base-model/bge-small-zh ($$SENTIMENT_BASE_MODEL_CACHE); a no-op once there.
base-model: install
	$(CLI) base-model

$(MODEL_DIR)/metrics.json:
	@echo "$(MODEL_DIR) is shipped in the repository: restore it (git checkout -- $(MODEL_DIR)) or rebuild it (make default-model)" >&2
	@exit 2

$(FAST_MODEL_DIR)/metrics.json:
	@echo "$(FAST_MODEL_DIR) is shipped in the repository: restore it (git checkout -- $(FAST_MODEL_DIR)) or rebuild it (make fast-model)" >&2
	@exit 2

# The served forms are derived, never shipped: rebuilt when their model changes, or the code that derives them
# (so a form exported before exports saved their checked fast tokenizer gains it, and starts without PaddleNLP).
# One rule per form, for every model directory D: D-onnx (ONNX export), D-int8 (its ONNX Runtime INT8),
# D-static (Paddle Inference).
EXPORTER := worker/training/export.py worker/training/onnx_export.py worker/model/fast_tokenizer.py
%-onnx/model.onnx: %/metrics.json %/model.safetensors %/model_manifest.json $(EXPORTER) | $(VENV)/.installed
	$(CLI) export --model $* --output-dir $*-onnx --format onnx --overwrite

# INT8 with fixed, calibrated activation scales (ort-static): a review's label does not depend on the reviews
# batched with it (`make batch-invariance` checks); ort-dynamic's per-batch scales changed 14 of 1,736 labels.
%-int8/model.onnx: %-onnx/model.onnx worker/training/quantize.py
	$(CLI) quantize --model $*-onnx --output-dir $*-int8 --heldout $*/heldout.jsonl --method ort-static --overwrite

%-static/sentiment_model.json: %/metrics.json %/model.safetensors %/model_manifest.json $(EXPORTER) | $(VENV)/.installed
	$(CLI) export --model $* --output-dir $*-static --overwrite

# The ONNX exports are kept (make deletes the middle of a chain of pattern rules otherwise).
.SECONDARY: $(ONNX_MODEL_DIR)/model.onnx $(FAST_ONNX_MODEL_DIR)/model.onnx

model: $(SERVED_MODEL_DIR)/model.onnx

model-static: $(STATIC_MODEL_DIR)/sentiment_model.json

fast-model-static: $(FAST_STATIC_MODEL_DIR)/sentiment_model.json

fast-model-int8: $(FAST_SERVED_MODEL_DIR)/model.onnx

teacher: base-model
	$(CLI) train $(TEACHER_FLAGS) --output-dir $(TEACHER_DIR)
	$(CLI) calibrate --model $(TEACHER_DIR)

candidate: install
	@test -f $(MODEL_DIR)/metrics.json || { echo "no teacher in $(MODEL_DIR) (the students learn from it): git checkout $(MODEL_DIR)" >&2; exit 2; }
	$(CLI) train $(STUDENT_FLAGS) --output-dir $(CANDIDATE_DIR)
	$(CLI) calibrate --model $(CANDIDATE_DIR)

# The promotion gate: a model replaces a shipped one only when it is not worse on the same held-out reviews.
default-model: teacher
	$(CLI) promote --candidate $(TEACHER_DIR) --default $(MODEL_DIR) --margin $(PROMOTION_MARGIN)
	rm -rf $(ONNX_MODEL_DIR) $(SERVED_MODEL_DIR) $(STATIC_MODEL_DIR)

fast-model: candidate
	$(CLI) promote --candidate $(CANDIDATE_DIR) --default $(FAST_MODEL_DIR) --margin $(PROMOTION_MARGIN)
	rm -rf $(FAST_STATIC_MODEL_DIR) $(FAST_ONNX_MODEL_DIR) $(FAST_SERVED_MODEL_DIR)

# The README's model table, one run: both shipped models, the default's served INT8 form, and the other
# models that exist here; each also drains a backlog through the local broker (end to end, peak RSS).
model-table: model fast-model-int8 kafka-up
	$(CLI) model-table --bootstrap-servers localhost:$(KAFKA_PORT) \
		--model $(MODEL_DIR) --model $(SERVED_MODEL_DIR) --model $(FAST_MODEL_DIR) --model $(FAST_SERVED_MODEL_DIR) \
		$(foreach dir,$(SCRATCH_DIR) $(TEACHER_DIR),$(if $(wildcard $(dir)/metrics.json),--model $(dir)))

# Each served INT8 form labels every held-out review alone and in mixed batches of 32: exit 1 unless no label
# changes and no probability moves more than 1e-4 (a few minutes on 2 cores).
batch-invariance: model fast-model-int8
	$(CLI) batch-invariance --heldout $(MODEL_DIR)/heldout.jsonl --model $(SERVED_MODEL_DIR) --model $(FAST_SERVED_MODEL_DIR)

scratch-model: install
	$(CLI) train --output-dir $(SCRATCH_DIR)

demo: install kafka-up model
	@bash deploy/demo.sh $(SERVED_MODEL_DIR) localhost:$(KAFKA_PORT) $(MODEL_DIR)

test: install browser prometheus-tools lint typecheck
	@rm -rf $(TEST_KAFKA_DIR) $(TEST_REGISTRY_DIR)
	$(LAUNCHER) up --port $(TEST_KAFKA_PORT) --data-dir $(TEST_KAFKA_DIR)
	@$(REGISTRY_LAUNCHER) up --port $(TEST_REGISTRY_PORT) --data-dir $(TEST_REGISTRY_DIR) \
		|| { $(LAUNCHER) down --data-dir $(TEST_KAFKA_DIR); exit 1; }
	@set +e; KAFKA_BOOTSTRAP_SERVERS=localhost:$(TEST_KAFKA_PORT) \
		SCHEMA_REGISTRY_URL=http://localhost:$(TEST_REGISTRY_PORT)/apis/ccompat/v7 $(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
		$(REGISTRY_LAUNCHER) down --port $(TEST_REGISTRY_PORT) --data-dir $(TEST_REGISTRY_DIR); \
		$(LAUNCHER) down --data-dir $(TEST_KAFKA_DIR); exit $$rc

test-unit: install prometheus-tools
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-faults: install
	$(PY) -m pytest tests/faults $(PYTEST_ARGS)

# Timing-proofing: the suite (or STRESS_TESTS, e.g. tests/faults) ROUNDS times in a row while STRESS_HOGS
# Python busy loops take a core each; every round must pass. Uses its own throw-away broker (tests/stress.sh).
ROUNDS ?= 3
STRESS_HOGS ?= 1
STRESS_TESTS ?= tests
test-stress: install browser prometheus-tools
	ROUNDS=$(ROUNDS) STRESS_HOGS=$(STRESS_HOGS) STRESS_TESTS="$(STRESS_TESTS)" PYTEST_ARGS="$(PYTEST_ARGS)" \
		TEST_KAFKA_PORT=$(TEST_KAFKA_PORT) PY=$(PY) bash tests/stress.sh

# Mutation testing (cosmic-ray) of the pure logic that guards the invariants, each module against its unit
# tests, in a copy of the tree (var/mutation/); one pytest run per mutant, so niced and a module at a time
# if the machine is busy: `make mutation MUTATION_MODULES="offsets backpressure"`. Fails below 85 % killed.
MUTATION_MODULES ?= offsets partitions backpressure records decode batch_plan consume_window
mutation: install
	MUTATION_MODULES="$(MUTATION_MODULES)" PY=$(CURDIR)/$(PY) nice -n 10 bash tests/mutation.sh

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

# The README's result and HTTP examples, as the worker and `serve` produce them with $(MODEL_DIR) (seconds).
readme-examples: install
	$(PY) docs/readme_examples.py --model $(MODEL_DIR)

clean:
	rm -rf var build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache

# The adapt study: a dev base trained on the corpus without the hotel reviews, adapted to 2,000 of them by each
# recipe (docs/adapt.md, docs/model-history.md). Long: run it in the background.
adapt-study: install
	$(PY) benchmarks/adapt_study.py --work-dir var/adapt-study
