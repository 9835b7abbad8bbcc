"""The long-running commands take their loaded model out of the garbage collector's reach."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import gc, weakref
from worker.runtime.process import freeze_loaded_heap

class Node:
    pass

garbage = Node(); garbage.me = garbage  # a reference cycle: only a collection frees it
dead = weakref.ref(garbage)
del garbage
kept = [Node() for _ in range(1000)]
before = gc.get_freeze_count()
freeze_loaded_heap()
print(dead() is None, gc.get_freeze_count() - before >= 1000, gc.get_count()[0] < 50)
"""


def test_freezing_collects_first_then_freezes_what_is_alive() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120, check=True
    )
    # The cycle was collected (not frozen forever), the live objects were frozen, generation 0 starts empty.
    assert out.stdout.split() == ["True", "True", "True"], out.stderr


def _loads_a_model(call: object) -> bool:
    """`load_model(...)`, `Labeller.from_settings(...)` or the composition root's `models_for(...)`."""
    func = getattr(call, "func", None)
    return (
        getattr(func, "id", None) in ("load_model", "models_for")
        or getattr(func, "attr", None) == "from_settings"
    )


def _calls_after_load_model(path: Path) -> list[str]:
    """Names of the calls of the statement right after each model load (`... = load_model(...)`, `... =
    Labeller.from_settings(...)`) in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    following: list[str] = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for current, after in zip(body, body[1:], strict=False):
            value = getattr(current, "value", None)
            if _loads_a_model(value) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Call):
                following.append(getattr(after.value.func, "id", "?"))
    return following


def test_run_serve_and_predict_freeze_the_heap_right_after_loading_their_model() -> None:
    # run and serve share the composition root's start-up; predict loads its model itself.
    for path in (ROOT / "worker" / "runtime" / "root.py", ROOT / "worker" / "cli" / "predict.py"):
        assert _calls_after_load_model(path) == ["freeze_loaded_heap"], path
