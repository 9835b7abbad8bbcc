"""What the operator commands do, without argparse: `produce`, `tail`, `lag`, `topics` (and `topics acls`),
`doctor` (its `checks`, `registry_checks`), `predict`, `tune` (its report) and `run --processes`
(`processes`); `review_files` reads review files for `produce` and `predict`; `registry_values` writes and
reads Schema Registry values for `produce` and `tail`. The measuring instruments are `worker.bench`.

Each module is imported by its command in `worker.cli` and by tests; nothing in the run path imports them.
"""

__all__ = [
    "acls",
    "checks",
    "doctor",
    "lag",
    "predict",
    "processes",
    "produce",
    "registry_checks",
    "registry_values",
    "review_files",
    "tail",
    "tls",
    "topics",
    "tune",
]
