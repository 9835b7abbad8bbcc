"""Poison input: a seeded, fuzzed stream of bad records mixed with valid reviews.

The worker must never crash; every bad record becomes a dead letter with a kind and a reason (original key
and value bytes untouched), every valid one a result. Re-run a failure with the same SEED to reproduce it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pytest

from schemas.dead_letter import HEADER_ERROR_KIND, HEADER_ERROR_REASON, DeadLetterKind
from tests.faults.harness import FaultScene, collecting, produce_all, running, tally, worker_env

pytestmark = pytest.mark.integration

SEED = 20261130
TOTAL = 1200
# Large values the worker can re-publish today: below librdkafka's default producer message.max.bytes
# (1,000,000) once the dead-letter headers or the result fields are added.
LARGE_VALUE_BYTES = 900_000
# The broker's default message.max.bytes is 1048588 per record batch; a value this big still fits.
BROKER_LIMIT_VALUE_BYTES = 1_040_000
TEXTS = (
    "质量很好，物流也快，非常满意",
    "太差了，用了两天就坏了",
    "一般般吧，价格还可以",
    "包装破损，客服不理人",
)
EMOJI = "😀😡👍💩🎉🙈🔥❤️🤮🥰"


@dataclass(frozen=True)
class Case:
    """One fuzzed input and what must come of it: "result", or a dead letter of one of `kinds`."""

    category: str
    value: bytes | None
    expect: str  # "result" | "dead_letter"
    kinds: frozenset[str] = frozenset()


def _dl(category: str, value: bytes | None, *kinds: DeadLetterKind) -> Case:
    return Case(category, value, "dead_letter", frozenset(k.value for k in kinds))


def _obj(**fields: object) -> bytes:
    return json.dumps(fields, ensure_ascii=False).encode()


def fuzz_case(rng: random.Random, i: int) -> Case:
    """A random input of a random category; about 40 % valid reviews."""
    if rng.random() < 0.4:
        return Case("valid", _obj(id=i, text=rng.choice(TEXTS), shop="s" * rng.randint(0, 50)), "result")
    category = rng.choice(
        [
            "random_bytes",
            "invalid_utf8",
            "deep_json",
            "wrong_type",
            "not_an_object",
            "missing_text",
            "control_raw",
            "control_escaped",
            "emoji",
            "empty",
            "bad_json",
            "bom_valid",
            "long_text",
        ]
    )
    if category == "random_bytes":
        # A leading 0xff is never valid UTF-8, so the outcome is certain whatever follows.
        return _dl(category, b"\xff" + rng.randbytes(rng.randint(0, 2000)), DeadLetterKind.INVALID_UTF8)
    if category == "invalid_utf8":
        text = rng.choice(TEXTS)
        cut = rng.randint(0, len(text))  # at a character boundary: the bad bytes cannot complete a character
        bad = rng.choice([b"\xc3\x28", b"\xed\xa0\x80", b"\xf0\x28\x8c", b"\x80", b"\xfe"])
        broken = text[:cut].encode() + bad + text[cut:].encode()
        return _dl(category, b'{"text": "' + broken + b'"}', DeadLetterKind.INVALID_UTF8)
    if category == "deep_json":
        depth = rng.choice([33, 100, 1000, 5000, 100_000])
        nest = "[" * depth + "]" * depth
        return _dl(category, f'{{"text": "好", "m": {nest}}}'.encode(), DeadLetterKind.INVALID_JSON)
    if category == "wrong_type":
        bad = rng.choice(
            [{"text": 5}, {"text": ["好"]}, {"text": None}, {"text": True}, {"text": "好", "id": 1.5}]
        )
        return _dl(category, json.dumps(bad).encode(), DeadLetterKind.WRONG_TYPE)
    if category == "not_an_object":
        top = rng.choice(['"好评"', "[1, 2]", "42", "null", "true", '[{"text": "好"}]'])
        return _dl(category, top.encode(), DeadLetterKind.NOT_AN_OBJECT)
    if category == "missing_text":
        return _dl(category, _obj(review=rng.choice(TEXTS), id=i), DeadLetterKind.MISSING_TEXT)
    if category == "control_raw":  # unescaped control characters inside a JSON string are not JSON
        ctl = "".join(chr(rng.randint(0, 31)) for _ in range(rng.randint(1, 5)))
        return _dl(category, f'{{"text": "好{ctl}评"}}'.encode(), DeadLetterKind.INVALID_JSON)
    if category == "control_escaped":  # escaped control characters around real text: a valid review
        ctl = "".join(chr(rng.randint(0, 31)) for _ in range(rng.randint(1, 20)))
        return Case(category, _obj(text=ctl + rng.choice(TEXTS) + ctl), "result")
    if category == "emoji":  # 100 % emoji is still text: labelled (the model sees unknown tokens)
        return Case(
            category, _obj(text="".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 200)))), "result"
        )
    if category == "empty":
        # Zero-width space, NUL, word joiner: no visible character, so empty_text.
        invisible = _obj(text="\u200b\u0000\u2060")
        value = rng.choice([b"", None, _obj(text=""), _obj(text="  \n\t "), b"\xef\xbb\xbf", invisible])
        kinds = (DeadLetterKind.EMPTY_VALUE, DeadLetterKind.EMPTY_TEXT, DeadLetterKind.INVALID_JSON)
        return _dl(category, value, *kinds)
    if category == "bad_json":
        bad = rng.choice(
            [
                b'{"text": "\xe5\xa5\xbd"',
                b'{"text": "x", "v": NaN}',
                b'{"text": "\\ud800"}',
                b'{"text": "x", "n": ' + b"9" * 5000 + b"}",
                b'{"text": "x", "m": {"price": 1e999}}',  # a float cannot hold it: refused, not made null
                b"{'text': 'x'}",
                b'{"text": "x",}',
            ]
        )
        return _dl(category, bad, DeadLetterKind.INVALID_JSON)
    if category == "bom_valid":
        return Case(category, "\ufeff".encode() + _obj(text=rng.choice(TEXTS)), "result")
    # long_text: more characters than max_text_chars (10,000)
    return _dl(category, _obj(text="好" * rng.randint(10_001, 30_000)), DeadLetterKind.TEXT_TOO_LONG)


def huge_cases(rng: random.Random, size: int) -> list[Case]:
    """Values of about `size` bytes: random bytes, a huge text, huge nesting, and a valid review with huge
    metadata (its result carries the metadata, so it is as big as the input)."""
    pad = size - 200
    return [
        _dl("huge_random", b"\xff" + rng.randbytes(size - 1), DeadLetterKind.INVALID_UTF8),
        _dl("huge_text", _obj(text="a" * pad), DeadLetterKind.TEXT_TOO_LONG),
        _dl(
            "huge_deep",
            b'{"text":"x","m":' + b"[" * (pad // 2) + b"]" * (pad // 2) + b"}",
            DeadLetterKind.INVALID_JSON,
        ),
        Case("huge_metadata", _obj(text="好评", blob="x" * (pad - 40)), "result"),
    ]


def poison_stream(
    seed: int = SEED, total: int = TOTAL, huge_bytes: int = LARGE_VALUE_BYTES
) -> list[tuple[bytes, Case]]:
    """(key, case) pairs: `total` fuzzed inputs with 4 huge ones spread among them; keys are unique ids."""
    rng = random.Random(seed)
    cases = [fuzz_case(rng, i) for i in range(total - 4)]
    for case in huge_cases(rng, huge_bytes):
        cases.insert(rng.randrange(len(cases)), case)
    return [(f"pz-{i:05d}".encode(), case) for i, case in enumerate(cases)]


def test_fuzzed_stream_never_crashes_the_worker_and_every_record_is_a_result_or_a_reasoned_dead_letter(
    scene: FaultScene,
) -> None:
    _run_poison("poison", poison_stream(), scene)


def test_values_at_the_broker_limit_are_dead_lettered_without_stopping_the_pipeline(
    scene: FaultScene,
) -> None:
    stream = poison_stream(seed=SEED + 1, total=60, huge_bytes=BROKER_LIMIT_VALUE_BYTES)
    _run_poison("poison-broker-limit", stream, scene)


def _run_poison(scenario: str, stream: list[tuple[bytes, Case]], scene: FaultScene) -> None:
    names, kafka_bootstrap = scene.topics(3, 3), scene.bootstrap
    total = len(stream)
    by_key = {key: case for key, case in stream}
    # The test producer may send values up to the broker's limit (librdkafka's default is 1,000,000).
    produce_all(
        kafka_bootstrap,
        names["reviews"],
        [(key, case.value) for key, case in stream],
        **{"message.max.bytes": 1_048_576, "compression.type": "none"},
    )
    env = worker_env(kafka_bootstrap, names, scene.model_dir)
    with (
        collecting(kafka_bootstrap, names) as collector,
        running(env, scene.log_dir, scenario, "--max-messages", str(total)) as worker,
    ):
        code = worker.wait(300)
        assert code == 0, f"the worker crashed on poison input (exit {code}):\n{worker.stderr_tail()}"
        assert "Traceback" not in worker.stderr()
        collector.wait_until(lambda: collector.count() >= total, 30, "every output")
        collector.settle(quiet_s=1.0)

    results, dead = collector.records(names["results"]), collector.records(names["dlq"])
    fig = tally(scenario, by_key, results, dead)
    fig.notes.update(
        {
            "seed": SEED,
            "valid": sum(c.expect == "result" for c in by_key.values()),
            "huge": sum(c.category.startswith("huge") for c in by_key.values()),
        }
    )
    scene.record(fig)
    assert fig.lost == 0 and fig.duplicates == 0
    wrong = []
    for record in results:
        case = by_key[record.key or b""]
        if case.expect != "result":
            wrong.append((record.key, case.category, "got a result"))
    for record in dead:
        case = by_key[record.key or b""]
        kind = record.headers.get(HEADER_ERROR_KIND, b"").decode()
        reason = record.headers.get(HEADER_ERROR_REASON, b"").decode()
        if case.expect != "dead_letter" or kind not in case.kinds or not reason.strip():
            wrong.append((record.key, case.category, kind, reason[:80]))
        elif record.value != case.value and not (record.value is None and case.value == b""):
            wrong.append((record.key, case.category, "dead letter value differs from the input"))
    assert not wrong, f"{len(wrong)} records with the wrong outcome (seed {SEED}): {wrong[:10]}"
    summary = worker.summary()
    assert summary["results"] == fig.results and summary["dead_letters"] == fig.dead_letters
