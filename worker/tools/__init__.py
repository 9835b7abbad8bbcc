"""What the operator commands do, without argparse: `produce`, `tail`, `lag`, `topics` (and `topics acls`),
`doctor`, `predict`, `tune` (its report) and `run --processes` (`processes`); `review_files` reads review
files for `produce` and `predict`. The measuring instruments are `worker.bench`.

Each module is imported by its command in `worker.cli` and by tests; nothing in the run path imports them.
"""

__all__ = [
    "acls",
    "doctor",
    "lag",
    "predict",
    "processes",
    "produce",
    "review_files",
    "tail",
    "tls",
    "topics",
    "tune",
]
