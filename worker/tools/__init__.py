"""What the commands do, without argparse: produce (`feed`), `tail`, `lag`, `topics`, `doctor`, `predict`,
`bench` (with `topic_io` and `worker_process`), `http_bench` (`bench --http`, with `naive_http`, the
baseline handler), `tune` (its report), `report` (record and render metrics), `backend_table`
(`compare-backends`).

Each module is imported by its command in `worker.cli` and by tests; nothing in the run path imports them.
"""

__all__ = [
    "backend_table",
    "bench",
    "doctor",
    "feed",
    "http_bench",
    "lag",
    "naive_http",
    "predict",
    "report",
    "tail",
    "topic_io",
    "topics",
    "tune",
    "worker_process",
]
