#!/usr/bin/env bash
# The full benchmark of issue 4: default model (trained if missing), tuned budget, 200,000-message backlog.
# Usage: benchmarks/run_full.sh [extra `sentiment-worker bench` flags]; needs a broker (make kafka-up or
# deploy/kafka/launcher.py up) at SENTIMENT_BOOTSTRAP_SERVERS (default localhost:9092).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
TRAINED=models/default
MODEL=${SENTIMENT_MODEL:-models/default-static}  # the exported model: the CPU default backend (static)
if [ -z "${SENTIMENT_MODEL:-}" ]; then
  [ -f "$TRAINED/metrics.json" ] || "$PY" -m worker train --output-dir "$TRAINED"
  [ -f "$MODEL/sentiment_model.json" ] || "$PY" -m worker export --model "$TRAINED" --output-dir "$MODEL" --overwrite
fi
mkdir -p benchmarks/results
"$PY" -m worker tune --model "$MODEL"
exec "$PY" -m worker bench --model "$MODEL" --messages 200000 \
  --json "benchmarks/results/bench-$(date -u +%Y%m%dT%H%M%S).json" "$@"
