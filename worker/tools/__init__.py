"""What the commands do, without argparse: produce (`feed`), `tail`, `lag`, `topics`, `doctor`, `predict`,
`bench` (with `topic_io` and `worker_process`), `tune` (its report), `report` (record and render metrics).

Each module is imported by its command in `worker.cli` and by tests; nothing in the run path imports them.
"""

__all__ = [
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
