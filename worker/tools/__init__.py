"""What the commands do, without argparse: produce (`feed`), `tail`, `lag`, `topics`, `doctor`, `predict`,
`bench` (with `topic_io` and `worker_process`), `tune` (its report), `report` (record and render metrics),
`backend_table` (`compare-backends`).

Each module is imported by its command in `worker.cli` and by tests; nothing in the run path imports them.
"""

__all__ = [
    "backend_table",
    "bench",
    "doctor",
    "feed",
    "lag",
    "predict",
    "report",
    "tail",
    "topic_io",
    "topics",
    "tune",
    "worker_process",
]
