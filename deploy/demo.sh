#!/usr/bin/env bash
# `make demo`: label the sample reviews through the real broker and print what came out.
# Usage: deploy/demo.sh MODEL_DIR BOOTSTRAP [TRAINING_DIR]   (the broker is already up, the model trained)
# MODEL_DIR is what the worker serves (`make demo`: the exported, static form); TRAINING_DIR (default
# MODEL_DIR) is where `train` wrote metrics.json and heldout.jsonl.
set -euo pipefail
model_dir=${1:-models/default}
bootstrap=${2:-localhost:9092}
cli=.venv/bin/sentiment-worker
run_id=$(date +%Y%m%d-%H%M%S)

export SENTIMENT_BOOTSTRAP_SERVERS=$bootstrap
export SENTIMENT_MODEL=$model_dir
export SENTIMENT_INPUT_TOPIC=demo-reviews-$run_id
export SENTIMENT_OUTPUT_TOPIC=demo-reviews-sentiment-$run_id
export SENTIMENT_DLQ_TOPIC=demo-reviews-dlq-$run_id
export SENTIMENT_GROUP_ID=demo-$run_id
export SENTIMENT_HTTP_PORT=0
export SENTIMENT_LOG_LEVEL=WARNING

echo "== topics (3 partitions each) =="
$cli topics create --partitions 3
echo
echo "== producing the sample reviews (deploy/samples/reviews.jsonl: food delivery, hotels, shops ...) =="
$cli produce deploy/samples/reviews.jsonl
training_dir=${3:-$model_dir}
heldout="$training_dir/heldout.jsonl"
if [ -f "$heldout" ]; then
  echo "== producing up to 2,000 held-out corpus reviews (the model never saw them), for throughput =="
  $cli produce "$heldout" --limit 2000
fi
echo
echo "== worker: consume → batch → ERNIE → publish (stops when the topic is drained) =="
$cli run --idle-exit-s 4 > "${TMPDIR:-/tmp}/demo-run-$run_id.json"
.venv/bin/python - "${TMPDIR:-/tmp}/demo-run-$run_id.json" <<'PY'
import json, sys
s = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("worker: {consumed} consumed, {results} results, {dead_letters} dead letters: {messages_per_second} "
      "messages/s over {labelling_seconds} s of labelling (first message consumed to last result "
      "acknowledged; {seconds} s in all with model load and the idle wait before exit)".format(**s))
PY
echo
echo "== results of the sample reviews =="
.venv/bin/python deploy/demo_table.py
echo
.venv/bin/python deploy/demo_accuracy.py "$model_dir" "$training_dir"
echo
echo "the demo's topics stay on the broker; list them, or delete them when done:"
echo "  $cli topics list --bootstrap-servers $bootstrap --topic 'demo-.*-$run_id'"
echo "  $cli topics delete --bootstrap-servers $bootstrap --topic 'demo-.*-$run_id' --yes"
