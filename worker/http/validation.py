"""The one validation of a `POST /v1/sentiment` body: JSON -> `SentimentRequest` -> the server's limits,
and each text by the one rule for odd texts (`schemas.review_input.text_problem`).

The JSON is parsed by pydantic's own parser (`model_validate_json`), which also refuses hostile JSON as
malformed: nesting past its recursion limit (200 levels), integers of more than 4,300 digits and unpaired
surrogate escapes (`"\\ud800"`). The body's size is bounded before it is read whole (`ApiGuard`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from schemas.dead_letter import DeadLetterKind
from schemas.http_api import SentimentRequest
from schemas.review_input import TextProblem, text_problem
from worker.config import HttpSettings, LimitsSettings

_BOM: Final = "\ufeff".encode()
_EXAMPLE: Final = 'send {"text": "..."} or {"texts": ["...", ...]}'
# What to change, after pydantic's words for the malformed JSON a client may not expect to be refused.
_JSON_HINTS: Final = (
    ("recursion limit", f"nested too deeply: {_EXAMPLE}"),
    ("number out of range", "send an id this long as a string"),
    ("hex escape", "a \\uXXXX escape needs 4 hex digits, and a surrogate (\\ud800-\\udfff) its pair"),
)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may hold: texts (more: 413) and characters per text (more: that text's error)."""

    max_texts: int
    max_text_chars: int

    @classmethod
    def from_settings(cls, http: HttpSettings, limits: LimitsSettings) -> RequestLimits:
        return cls(max_texts=http.http_max_texts, max_text_chars=limits.max_text_chars)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a body is refused: the HTTP status and the `{error, reason}` of the answer."""

    status: int
    error: str
    reason: str


@dataclass(frozen=True, slots=True)
class RequestItem:
    """One review of a request: its id (given, or its position), text, and why it is not labelled (None: it
    is labelled)."""

    id: str
    text: str
    problem: TextProblem | None = None


def validate_body(body: bytes, limits: RequestLimits) -> list[RequestItem] | Refusal:
    """The reviews of a UTF-8 JSON `body`, in request order (ids default to the position), each checked by
    the one rule for odd texts; or the refusal: 422 `invalid_request` (empty or malformed JSON, the request
    schema not met), 413 `too_many_texts`. A bad text of a `texts` list gets its own problem, the others
    are labelled; a bad single `text` refuses the request (422 `invalid_request` for an empty text,
    `text_too_long` for a long one): a request of one text gets its answer in the status."""
    if not body:
        return Refusal(422, "invalid_request", f"the body is empty: {_EXAMPLE}")
    try:
        # A leading byte order mark is tolerated, as json.loads does (pydantic's parser does not).
        request = SentimentRequest.model_validate_json(body[3:] if body.startswith(_BOM) else body)
    except ValidationError as exc:
        return Refusal(422, "invalid_request", _reason(exc.errors()))
    pairs = request.items()
    if len(pairs) > limits.max_texts:
        return Refusal(413, "too_many_texts", f"{len(pairs)} texts; at most {limits.max_texts}")
    items = [RequestItem(item_id, text, text_problem(text, limits.max_text_chars)) for item_id, text in pairs]
    problem = items[0].problem
    if request.text is not None and problem is not None:
        error = "text_too_long" if problem.kind is DeadLetterKind.TEXT_TOO_LONG else "invalid_request"
        return Refusal(422, error, f"text: {problem.reason}")
    return items


def _reason(errors: Any) -> str:
    """pydantic's errors as one line: `texts.1: Input should be a valid string; ...` (at most 5)."""
    parts = []
    for error in list(errors)[:5]:
        loc = [str(p) for p in error.get("loc", ())]
        if error.get("type") == "json_invalid":
            detail = str((error.get("ctx") or {}).get("error", ""))
            hints = [hint for words, hint in _JSON_HINTS if words in detail]
            parts.append("; ".join([f"malformed JSON: {detail}".rstrip(": "), *hints]))
            continue
        msg = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{'.'.join(loc)}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid request"
