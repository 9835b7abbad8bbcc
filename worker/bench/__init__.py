"""The measuring instruments, without argparse: `bench` (a worker draining a backlog against the model
alone and against `predict_rate`, the `predict` command's marginal rate, printed by `bench_table`, with
`topic_io` and `worker_process`, which the fault tests share), `host_ceiling` (`bench --host-ceiling`: the
worker on the identity model beside a minimal Kafka loop, with each thread's CPU per review), `http_bench`
(`bench --http`, its load generator `http_load`, against `naive_http`, the documents' baseline handler that
`bench --naive-server` serves), `compare_backends`, `model_table`, `int8_ceiling`, `batch_invariance` (do
labels depend on batch-mates), and `report` (record and render metrics).

Each module is imported by its command in `worker.cli` and by tests; nothing in the run path imports them.
"""

__all__ = [
    "batch_invariance",
    "bench",
    "bench_table",
    "compare_backends",
    "host_ceiling",
    "http_bench",
    "http_load",
    "int8_ceiling",
    "model_table",
    "naive_http",
    "predict_rate",
    "report",
    "topic_io",
    "worker_process",
]
