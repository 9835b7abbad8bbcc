"""What the operator commands do, without argparse: `produce`, `tail`, `lag`, `topics` (and `topics acls`),
`doctor` (its `checks`, `registry_checks`), `tune` (its report); `registry_values` writes and reads Schema
Registry values for `produce` and `tail`. The files door (`predict`) is `worker.files`, the `--processes`
supervisor `worker.runtime.processes`; the measuring instruments are `worker.bench`.

Each module is imported by its command in `worker.cli` and by tests; nothing in the run path imports them.
"""

__all__ = [
    "acls",
    "adapt_rows",
    "checks",
    "doctor",
    "lag",
    "produce",
    "registry_checks",
    "registry_values",
    "tail",
    "tls",
    "topics",
    "tune",
]
