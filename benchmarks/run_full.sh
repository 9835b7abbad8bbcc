#!/usr/bin/env bash
# The full benchmark of issue 4: default model (trained if missing), tuned budget, 200,000-message backlog.
# Usage: benchmarks/run_full.sh [extra `sentiment-worker bench` flags]; needs a broker (make kafka-up or
# deploy/kafka/launcher.py up) at SENTIMENT_BOOTSTRAP_SERVERS (default localhost:9092).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
MODEL=${SENTIMENT_MODEL:-models/default}
[ -f "$MODEL/config.json" ] || "$PY" -m worker train --output-dir "$MODEL"
mkdir -p benchmarks/results
"$PY" -m worker tune --model "$MODEL"
exec "$PY" -m worker bench --model "$MODEL" --messages 200000 \
  --json "benchmarks/results/bench-$(date -u +%Y%m%dT%H%M%S).json" "$@"
