#!/usr/bin/env bash
# The full benchmark: the served default model (make model: ONNX Runtime INT8 of the shipped models/default),
# tuned budget, 200,000-message backlog.
# Usage: benchmarks/run_full.sh [extra `sentiment-worker bench` flags]; needs a broker (make kafka-up or
# deploy/kafka/launcher.py up) at SENTIMENT_BOOTSTRAP_SERVERS (default localhost:9092).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
MODEL=${SENTIMENT_MODEL:-models/default-int8}  # what the worker serves on CPU by default
if [ -z "${SENTIMENT_MODEL:-}" ]; then
  make model  # derives models/default-int8 from the shipped models/default (a no-op when up to date)
fi
mkdir -p benchmarks/results
"$PY" -m worker tune --model "$MODEL"
exec "$PY" -m worker bench --model "$MODEL" --messages 200000 \
  --json "benchmarks/results/bench-$(date -u +%Y%m%dT%H%M%S).json" "$@"
