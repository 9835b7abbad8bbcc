#!/usr/bin/env bash
# `make test-stress`: the test suite ROUNDS times in a row (3 by default) while CPU hogs (a Python busy loop
# each, STRESS_HOGS=1 by default) run beside it, so a test that depends on timing fails here first.
#   STRESS_TESTS   what pytest runs each round (default: tests, the whole suite; e.g. "tests/faults")
#   PYTEST_ARGS    extra pytest arguments
#   KAFKA_BOOTSTRAP_SERVERS   a broker to use; without it a throw-away broker is started on
#                  TEST_KAFKA_PORT (19092) in var/kafka-stress and stopped at the end
# Prints one line per round (passed/failed, seconds) and exits non-zero if any round failed.
set -u
PY=${PY:-.venv/bin/python}
ROUNDS=${ROUNDS:-3}
STRESS_HOGS=${STRESS_HOGS:-1}
STRESS_TESTS=${STRESS_TESTS:-tests}
PYTEST_ARGS=${PYTEST_ARGS:-}
PORT=${TEST_KAFKA_PORT:-19092}
DATA_DIR=var/kafka-stress

hogs=()
own_broker=""
cleanup() {
    for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null; done
    if [[ -n "$own_broker" ]]; then "$PY" deploy/kafka/launcher.py down --data-dir "$DATA_DIR" >/dev/null; fi
}
trap cleanup EXIT

if [[ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]]; then
    rm -rf "$DATA_DIR"
    "$PY" deploy/kafka/launcher.py up --port "$PORT" --controller-port $((PORT + 1)) --data-dir "$DATA_DIR" || exit 2
    own_broker=1
    export KAFKA_BOOTSTRAP_SERVERS=localhost:$PORT
fi
for ((i = 0; i < STRESS_HOGS; i++)); do
    "$PY" -c 'while True: pass' &
    hogs+=($!)
done
echo "stress: ${#hogs[@]} CPU hog(s) running (pids ${hogs[*]}); $ROUNDS rounds of: pytest $STRESS_TESTS $PYTEST_ARGS"

summary=()
failed=0
for ((round = 1; round <= ROUNDS; round++)); do
    started=$SECONDS
    # shellcheck disable=SC2086 # the selections are word lists on purpose
    if "$PY" -m pytest $STRESS_TESTS $PYTEST_ARGS; then verdict=passed; else verdict=FAILED; failed=$((failed + 1)); fi
    summary+=("stress round $round/$ROUNDS: $verdict in $((SECONDS - started)) s")
    echo "${summary[-1]}"
done
printf '%s\n' "${summary[@]}"
echo "stress: $((ROUNDS - failed)) of $ROUNDS rounds passed beside ${#hogs[@]} CPU hog(s)"
[[ $failed -eq 0 ]]
