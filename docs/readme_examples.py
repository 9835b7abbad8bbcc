"""The README's example outputs, produced by the code that makes them: `python docs/readme_examples.py
[--model DIR]` (`make readme-examples`; a few seconds on the CPU, no broker).

- The **Result** block: what the worker publishes for the README's **Input** example: the value decoded by
  the worker's decoder, labelled by the model, built by the worker's result builder.
- The HTTP block: what `serve` answers the README's curl command (a real server on a free local port).

Both are rewritten in README.md in place (each is the fenced block holding its marker text). The unit test
tests/unit/test_readme_examples.py checks without a model that both still parse into their schemas with
every field, and that they name the model models/default/sentiment_model.json names.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx

from schemas.review_decode import decode_review
from schemas.review_input import Review
from schemas.sentiment_result import ModelRef
from worker.config import WorkerSettings
from worker.kafka.producer import SourcePosition
from worker.kafka.records import InputMessage, ResultWriter
from worker.runtime.logs import configure_logging

ROOT: Final = Path(__file__).resolve().parents[1]
README: Final = ROOT / "README.md"
DEFAULT_MODEL: Final = ROOT / "models" / "default"
WIDTH: Final = 110

# Each block is the README's fenced block containing this text.
INPUT_MARKER: Final = '"id": "order-8812", "text"'
RESULT_MARKER: Final = '"schema_name": "sentiment-result"'
HTTP_MARKER: Final = "curl -s localhost:9108/v1/sentiment"

# Where the example input was read from (the README says so of every result).
SOURCE: Final = SourcePosition(topic="reviews", partition=2, offset=1841, timestamp_ms=1764470000000)
HTTP_REQUEST: Final = {"texts": ["外卖送得很快，饭菜还是热的", "等了两个小时，菜都凉了"], "ids": ["a", "b"]}


def fenced_blocks(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, body) of each ``` fenced block: text[start:end] is the body, without the fences."""
    position = 0
    while (opening := text.find("```", position)) >= 0:
        start = text.index("\n", opening) + 1
        end = text.index("```", start)
        yield start, end, text[start:end]
        position = end + 3


def block(readme: str, marker: str) -> str:
    """The body of the fenced block holding `marker`."""
    bodies = [body for _, _, body in fenced_blocks(readme) if marker in body]
    if len(bodies) != 1:
        raise ValueError(f"README.md has {len(bodies)} fenced blocks holding {marker!r}, not one")
    return bodies[0]


def replace_block(readme: str, marker: str, body: str) -> str:
    for start, end, old in fenced_blocks(readme):
        if marker in old:
            return readme[:start] + body + readme[end:]
    raise ValueError(f"README.md has no fenced block holding {marker!r}")


def http_response_json(body: str) -> dict[str, Any]:
    """The response JSON of the HTTP block: everything after the curl command."""
    start = body.index("\n{")
    parsed: dict[str, Any] = json.loads(body[start:])
    return parsed


def pack(value: Any, column: int = 0) -> str:
    """`value` as JSON on lines of at most WIDTH characters, its first line starting at `column`: an object's
    members (a list's items) are packed greedily; one too long for a line is broken the same way."""
    flat = json.dumps(value, ensure_ascii=False)
    if not isinstance(value, (dict, list)) or not value or column + len(flat) <= WIDTH:
        return flat
    items = list(value.items()) if isinstance(value, dict) else [(None, v) for v in value]
    opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
    inner = " " * (column + 1)
    out, position, first_on_line = opening, column + 1, True
    for i, (key, item) in enumerate(items):
        name = "" if key is None else json.dumps(key, ensure_ascii=False) + ": "
        tail = closing if i == len(items) - 1 else ","
        piece = name + json.dumps(item, ensure_ascii=False) + tail
        if not first_on_line and position + 1 + len(piece) > WIDTH:
            out, position, first_on_line = out + "\n" + inner, len(inner), True
        separator = "" if first_on_line else " "
        if position + len(separator) + len(piece) > WIDTH:
            piece = name + pack(item, position + len(separator) + len(name)) + tail
        out += separator + piece
        last_line = piece.rsplit("\n", 1)[-1]
        position = len(last_line) if "\n" in piece else position + len(separator) + len(piece)
        first_on_line = False
    return out


def result_example(classifier: Any, model: ModelRef, input_value: bytes) -> dict[str, Any]:
    """The worker's result for `input_value`, read at SOURCE."""
    s = WorkerSettings()
    message = InputMessage(
        position=SOURCE, key=b"order-8812", value=input_value, consumed_at=time.monotonic()
    )
    review = decode_review(
        input_value,
        input_format=s.input_format,
        max_value_bytes=s.max_value_bytes,
        max_text_chars=s.max_text_chars,
        max_json_depth=s.max_json_depth,
        default_id=message.default_id,
    )
    if not isinstance(review, Review):
        raise ValueError(f"the README's input example does not decode: {review}")
    classifier.predict_texts([review.text])  # warm: the example shows a warm model's time
    message = message._replace(consumed_at=time.monotonic())
    probabilities = classifier.predict_texts([review.text])[0]
    record = ResultWriter(list(classifier.labels), model).record(
        message,
        review,
        probabilities,
        topic=s.output_topic,
        partition=SOURCE.partition,
        now=time.monotonic(),
    )
    parsed: dict[str, Any] = json.loads(record.value or b"{}")
    return parsed


def http_example(classifier: Any, model: ModelRef) -> dict[str, Any]:
    """`serve`'s answer to HTTP_REQUEST (a real server in this process, on a free port)."""
    from worker.http.serving import SentimentApi  # here: the README test imports this file, not a server

    stop = threading.Event()
    listening: list[tuple[str, int]] = []
    service = SentimentApi(
        WorkerSettings(http_port=0, worker_id="readme").sections,
        classifier,
        model,
        stop=stop,
        on_listening=listening.append,
    )
    thread = threading.Thread(target=service.run, name="readme-serve", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        url = ""
        while time.monotonic() < deadline:
            if listening:
                url = f"http://{listening[0][0]}:{listening[0][1]}"
                if httpx.get(url + "/readyz").status_code == 200:
                    break
            time.sleep(0.1)
        else:
            raise RuntimeError("serve did not become ready within 120 s")
        answers = []
        for _ in range(3):  # the quickest of three (the first also warms the server)
            answer = httpx.post(url + "/v1/sentiment", json=HTTP_REQUEST)
            answer.raise_for_status()
            answers.append(answer.json())
        quickest: dict[str, Any] = min(answers, key=lambda a: a["timing"]["total_ms"])
        return quickest
    finally:
        stop.set()
        thread.join(60)


def http_block(response: dict[str, Any]) -> str:
    request = json.dumps(HTTP_REQUEST, ensure_ascii=False)
    return f"{HTTP_MARKER} -H 'Content-Type: application/json' \\\n     -d '{request}'\n{pack(response)}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, default=DEFAULT_MODEL, help="the model that labels the examples"
    )
    args = parser.parse_args()
    configure_logging("WARNING")  # the CLI's: no Paddle warnings, no PaddleNLP or httpx INFO lines
    # Imported here: the README test reads this file's helpers without loading Paddle.
    from worker.model.device import choose_device
    from worker.model.loading import load_classifier

    classifier = load_classifier(str(args.model), choose_device("cpu"))
    model = ModelRef(name=classifier.name, version=classifier.version)
    readme = README.read_text(encoding="utf-8")
    input_value = block(readme, INPUT_MARKER).strip().encode("utf-8")
    readme = replace_block(readme, RESULT_MARKER, pack(result_example(classifier, model, input_value)) + "\n")
    readme = replace_block(readme, HTTP_MARKER, http_block(http_example(classifier, model)))
    README.write_text(readme, encoding="utf-8")
    print(f"README.md: the result and HTTP examples of {model.name} {model.version}")


if __name__ == "__main__":
    main()
