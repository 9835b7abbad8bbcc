"""The files door: review files (TXT, CSV, JSONL) in, one labelled row per input row out, through the
Labeller (`predict`, no Kafka). `review_files` reads files as teams export them, with the one odd-row
rule, for `predict` and `produce`; `predict` labels their rows in input order, a bounded number of chunks
in flight."""

__all__ = ["predict", "review_files"]
