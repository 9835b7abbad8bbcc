"""Prints the demo's results for the sample reviews next to the human label (used by deploy/demo.sh)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from worker.config import load_settings
from worker.tools.tail import fit, tail_records

SAMPLES = Path(__file__).resolve().parent / "samples" / "reviews.jsonl"


def main() -> int:
    settings = load_settings()
    samples = {r["id"]: r for r in map(json.loads, SAMPLES.read_text(encoding="utf-8").splitlines())}
    results = {}
    for record in tail_records(settings.librdkafka_common(), settings.output_topic, idle_exit_s=3):
        result = json.loads(record.value or b"{}")
        if result.get("id") in samples:
            results[result["id"]] = result
    print(f"{'ID':9} {'DOMAIN':11} {'HUMAN':9} {'MODEL':9} {'CONF':>5}  REVIEW")
    agree = 0
    for review_id, sample in samples.items():
        result = results.get(review_id)
        if result is None:
            print(f"{review_id:9} {sample['domain']:11} {sample['expected']:9} {'MISSING':9}")
            continue
        agree += result["label"] == sample["expected"]
        mark = " " if result["label"] == sample["expected"] else "✗"
        print(
            f"{review_id:9} {sample['domain']:11} {sample['expected']:9} {result['label']:9}"
            f" {result['confidence']:5.2f}{mark} {fit(sample['text'], 60)}"
        )
    print(
        f"\n{len(results)}/{len(samples)} sample reviews labelled; the model agrees with the human label on "
        f"{agree} of them (these domains are not in its training corpus)"
    )
    return 0 if len(results) == len(samples) else 1


if __name__ == "__main__":
    sys.exit(main())
