"""Marks the mutants that cosmic-ray made inside type annotations as skipped (run by tests/mutation.sh after
`cosmic-ray init`, before `exec`).

A module with `from __future__ import annotations` never evaluates its annotations, so a mutant there
(`int | None` → `int - None`, `Literal["x"]` → `Literal["XX"]`) cannot change what the code does: it is an
equivalent mutant, and counting it as a survivor would only lower the score. Modules without that import
evaluate their annotations at import time, so nothing of theirs is skipped.

Usage: python tests/mutation_annotations.py SESSION.sqlite
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

Position = tuple[int, int]  # (line, column): lines from 1, columns from 0, as both ast and cosmic-ray count


def annotation_spans(source: str) -> list[tuple[Position, Position]]:
    """(start, end) of every annotation that is never evaluated: none unless the module starts with
    `from __future__ import annotations`."""
    tree = ast.parse(source)
    postponed = any(
        isinstance(node, ast.ImportFrom)
        and node.module == "__future__"
        and any(alias.name == "annotations" for alias in node.names)
        for node in tree.body
    )
    if not postponed:
        return []
    annotations: list[ast.expr] = []
    for node in ast.walk(tree):
        annotation: ast.expr | None = None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            annotation = node.returns
        elif isinstance(node, (ast.arg, ast.AnnAssign)):
            annotation = node.annotation
        if annotation is not None:
            annotations.append(annotation)
    return [
        ((a.lineno, a.col_offset), (a.end_lineno or a.lineno, a.end_col_offset or a.col_offset))
        for a in annotations
    ]


def inside_annotation(start: Position, end: Position, spans: list[tuple[Position, Position]]) -> bool:
    """True when the mutated stretch [start, end] lies wholly within one annotation."""
    return any(s <= start and end <= e for s, e in spans)


def main(argv: list[str]) -> int:
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    spans: dict[Path, list[tuple[Position, Position]]] = {}
    skipped = 0
    with use_db(argv[0]) as db:
        for item in db.work_items:
            paths = [Path(m.module_path) for m in item.mutations]
            for path in paths:
                if path not in spans:
                    spans[path] = annotation_spans(path.read_text(encoding="utf-8"))
            if item.mutations and all(
                inside_annotation(m.start_pos, m.end_pos, spans[Path(m.module_path)]) for m in item.mutations
            ):
                db.set_result(
                    item.job_id,
                    WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="inside an annotation"),
                )
                skipped += 1
    print(f"{skipped} mutants inside annotations skipped (never evaluated: equivalent)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
