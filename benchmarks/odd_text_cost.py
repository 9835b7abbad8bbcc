"""What the one rule for odd texts costs at each door (issue 50, finding 8): µs per hostile 1 MB value (a
text of spaces or U+200B then an `x`, over the 10,000-character limit; or 256 texts under it in one HTTP
body) and per normal review, the best of 5 repeats. CPU only, no model, no broker.

    PYTHONPATH=. .venv/bin/python benchmarks/odd_text_cost.py

To compare two trees, run it with PYTHONPATH pointing at each (e.g. a `git archive` of the older commit).
"""

from __future__ import annotations

import json
import timeit
from collections.abc import Callable

from schemas.review_decode import decode_review
from schemas.review_input import text_problem
from worker.http.validation import RequestLimits, validate_body

MB = 1_048_576
LIMIT = 10_000
REVIEW = "外卖送得很快，饭菜还是热的，包装也很好，下次还会再来。"


def best_us(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def kafka(value: bytes, input_format: str = "json") -> Callable[[], object]:
    return lambda: decode_review(
        value,
        input_format=input_format,  # type: ignore[arg-type]
        max_value_bytes=MB,
        max_text_chars=LIMIT,
        max_json_depth=32,
        default_id="t/0/0",
    )


def main() -> None:
    limits = RequestLimits(max_texts=256, max_text_chars=LIMIT)
    spaces_json = json.dumps({"text": " " * (MB - 20) + "x"}).encode()
    zw_json = json.dumps({"text": "\u200b" * ((MB - 20) // 3) + "x"}, ensure_ascii=False).encode()
    spaces_text = (" " * (MB - 1) + "x").encode()
    per = min((MB - 64) // 256 - 4, LIMIT)
    http_spaces = json.dumps({"texts": [" " * (per - 1) + "x"] * 256}).encode()
    http_zw = json.dumps(
        {"texts": ["\u200b" * ((MB - 64) // 768 - 3) + "x"] * 256}, ensure_ascii=False
    ).encode()
    normal = json.dumps({"id": "r-1", "text": REVIEW, "shop": "s1"}, ensure_ascii=False).encode()
    http_normal = json.dumps({"texts": [REVIEW] * 32}, ensure_ascii=False).encode()
    rows: list[tuple[str, Callable[[], object], int, int]] = [
        ("kafka json: 1 MB of spaces + x", kafka(spaces_json), 5, len(spaces_json)),
        ("kafka json: 1 MB of U+200B + x", kafka(zw_json), 5, len(zw_json)),
        ("kafka text: 1 MB of spaces + x", kafka(spaces_text, "text"), 5, len(spaces_text)),
        (
            "http: 256 texts of spaces + x (1 MB)",
            lambda: validate_body(http_spaces, limits),
            5,
            len(http_spaces),
        ),
        ("http: 256 texts of U+200B + x (1 MB)", lambda: validate_body(http_zw, limits), 5, len(http_zw)),
        ("kafka json: a normal review", kafka(normal), 20_000, len(normal)),
        ("http: 32 normal reviews", lambda: validate_body(http_normal, limits), 2_000, len(http_normal)),
        ("text_problem: a normal review", lambda: text_problem(REVIEW, LIMIT), 100_000, len(REVIEW.encode())),
    ]
    for name, fn, number, size in rows:
        print(f"{name:40s} {size:>9,} B {best_us(fn, number):12.1f} µs", flush=True)


if __name__ == "__main__":
    main()
