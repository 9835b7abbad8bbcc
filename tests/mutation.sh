#!/usr/bin/env bash
# `make mutation`: cosmic-ray mutation testing of the pure logic that guards the invariants, each module
# against its own unit tests. It runs in a copy of the tracked tree (var/mutation/tree): cosmic-ray edits the
# module on disk for each mutant, and nothing else may see that. CPU heavy (one pytest run per mutant): run
# it niced, a module or two at a time: MUTATION_MODULES="offsets backpressure".
# Mutants inside annotations (never evaluated: equivalent) are skipped (tests/mutation_annotations.py).
# Prints, per module, the mutants killed out of those tried; exits non-zero below MUTATION_MIN_SCORE (85).
set -u
PY=${PY:-$PWD/.venv/bin/python}
BIN=$(dirname "$PY")
MODULES=${MUTATION_MODULES:-"offsets partitions backpressure records decode batch_plan consume_window"}
MIN_SCORE=${MUTATION_MIN_SCORE:-85}
OUT=$PWD/var/mutation
declare -A SOURCE=(
    [offsets]=worker/kafka/offsets.py [partitions]=worker/kafka/partitions.py
    [backpressure]=worker/kafka/backpressure.py [records]=worker/kafka/records.py
    [decode]=schemas/review_decode.py [batch_plan]=worker/inference/batch_plan.py
    [consume_window]=worker/kafka/consume_window.py
)
declare -A TESTS=(
    [offsets]=tests/unit/kafka/test_offsets.py [partitions]=tests/unit/kafka/test_partitions.py
    [backpressure]=tests/unit/kafka/test_backpressure.py [records]=tests/unit/kafka/test_records.py
    [decode]=tests/unit/test_review_decode.py [batch_plan]=tests/unit/inference/test_batch_plan.py
    [consume_window]=tests/unit/inference/test_batch_plan.py
)

rm -rf "$OUT/tree" && mkdir -p "$OUT/tree"
git ls-files -z -- worker schemas tests pyproject.toml | xargs -0 cp --parents -t "$OUT/tree"
cd "$OUT/tree" || exit 2
summary=()
low=0
for module in $MODULES; do
    src=${SOURCE[$module]:?unknown module $module}
    cat > "$OUT/$module.toml" <<TOML
[cosmic-ray]
module-path = "$src"
timeout = 60.0
excluded-modules = []
test-command = "$PY -m pytest -x -q -p no:cacheprovider ${TESTS[$module]}"

[cosmic-ray.distributor]
name = "local"
TOML
    session="$OUT/$module.sqlite"
    rm -f "$session"
    "$BIN/cosmic-ray" init "$OUT/$module.toml" "$session" || exit 2
    "$PY" tests/mutation_annotations.py "$session" || exit 2  # equivalent mutants: never evaluated
    PYTHONPATH=$PWD "$BIN/cosmic-ray" exec "$OUT/$module.toml" "$session" || exit 2
    "$BIN/cr-report" "$session" --show-pending > "$OUT/$module.report.txt"
    read -r total survived skipped < <("$PY" - "$session" <<'PYCODE'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT worker_outcome, test_outcome FROM work_results").fetchall()
tried = [test for worker, test in rows if not str(worker).lower().endswith("skipped")]
print(len(tried), sum(1 for outcome in tried if str(outcome).lower().endswith("survived")), len(rows) - len(tried))
PYCODE
)
    killed=$((total - survived))
    score=$((total ? 100 * killed / total : 0))
    summary+=("mutation $module ($src): $killed of $total mutants killed ($score %; $skipped inside annotations skipped); survivors: $OUT/$module.report.txt")
    echo "${summary[-1]}"
    [[ $score -lt $MIN_SCORE ]] && low=1
done
printf '%s\n' "${summary[@]}"
exit $low
