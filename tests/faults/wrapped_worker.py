"""`python -m tests.faults.wrapped_worker run ...`: the real `sentiment-worker run`, its model wrapped by
`tests.model_wrappers` as the environment asks, for fault tests that need a real process (signals).

TEST_MODEL_STALL_S=S: every batch holding a review with `SLOW_MARKER` takes S seconds; the worker logs
"test model: stalling" to stderr when such a batch starts.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import worker.labelling.control as control_module
import worker.runtime.root as root_module
from tests.model_wrappers import StallOn
from worker.cli import main
from worker.labelling.loading import LoadedModel

STALL_LINE = "test model: stalling"


def _announce() -> None:
    print(f"{STALL_LINE} for {os.environ['TEST_MODEL_STALL_S']} s", file=sys.stderr, flush=True)


def _wrapped_load_model(model: Any, batching: Any) -> LoadedModel:
    classifier, ref, path = _real_load_model(model, batching)
    stall_s = os.environ.get("TEST_MODEL_STALL_S")
    if stall_s:
        classifier = StallOn(classifier, float(stall_s), on_stall=_announce)
    return LoadedModel(classifier, ref, path)


_real_load_model = root_module.load_model
# The composition root loads the configured model and ModelControl any model the control topic names; each
# looks `load_model` up in its own module at call time.
root_module.load_model = _wrapped_load_model  # type: ignore[assignment]
control_module.load_model = _wrapped_load_model  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
