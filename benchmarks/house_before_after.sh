#!/usr/bin/env bash
# Issue 46's before/after: alternated pairs of `bench` drain (MODE=drain) or `bench --http` (MODE=http), the tree
# BEFORE (default ../before: `git worktree add --detach ../before 97e13c7`, then `make model` in it) against AFTER
# (default: this checkout), same virtualenv, same broker (BOOTSTRAP, default localhost:9092); JSON and logs in OUT.
#   MODE=http PAIRS=4 OUT=var/house-pairs bash benchmarks/house_before_after.sh
# Results: benchmarks/results/2026-12-06-house-before-after-xeon.md
set -u
BEFORE=$(cd "${BEFORE:-../before}" && pwd)
AFTER=$(cd "${AFTER:-.}" && pwd)
OUT=${OUT:-var/house-pairs}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
PAIRS=${PAIRS:-3}
MODE=${MODE:-drain}
BOOTSTRAP=${BOOTSTRAP:-localhost:9092}
PY=$AFTER/.venv/bin/python
for i in $(seq 1 "$PAIRS"); do
  for side in before after; do
    if [ $side = before ]; then dir=$BEFORE; else dir=$AFTER; fi
    if [ "$MODE" = drain ]; then
      args="--model $dir/models/default-int8 --messages 20000 --drains 1 --model-only-messages 2000 --predict-messages 0 --naive-messages 50 --latency-messages 300"
    else
      args="--model $dir/models/default-int8 --http --requests 1500 --overload-s 5"
    fi
    (cd "$dir" && env -u SENTIMENT_MODEL -u OMP_NUM_THREADS PYTHONPATH="$dir" "$PY" -m worker bench \
      --bootstrap-servers "$BOOTSTRAP" $args --json "$OUT/$MODE-$side-$i.json" > "$OUT/$MODE-$side-$i.log" 2>&1)
    echo "$MODE $side $i rc=$?"
  done
done
