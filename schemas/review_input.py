"""The input contract: one review per Kafka record value (JSON mode), and the one rule for odd texts that
every front door applies (`text_problem`: the worker, `produce`, `predict` and the HTTP API)."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

from schemas.dead_letter import DeadLetterKind

_INVISIBLE: Final = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})
"""Unicode categories of characters that show nothing: control, format (zero-width spaces and joiners,
direction marks, U+FEFF), and space, line and paragraph separators; every whitespace character is in one."""

_INVISIBLE_RUN: Final = re.compile(
    "[\x00-\x20\x7f-\xa0\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u1680\u180e"
    "\u2000-\u200f\u2028-\u202f\u205f-\u2064\u2066-\u206f\u3000\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f]*"
)
"""A run of characters of the `_INVISIBLE` categories (Unicode 14, Python 3.11's `unicodedata`; a unit test
keeps the two equal), skipped at C speed: 1 MB of spaces costs about a millisecond, not 86."""

EMPTY_TEXT_REASON: Final = (
    "text is empty or has no visible character (only whitespace, control or format characters such as "
    "zero-width spaces)"
)


@dataclass(frozen=True, slots=True)
class Review:
    """A review to label, as every front door hands it to the Labeller: its id (the input's, or the door's
    default: topic/partition/offset, a line number), the text as given, and the input's other fields (the
    result's `metadata`; what a route by field reads)."""

    id: str
    text: str
    metadata: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TextProblem:
    """Why a text is not labelled: `empty_text` or `text_too_long`, and the reason in words."""

    kind: DeadLetterKind
    reason: str


def has_visible_character(text: str) -> bool:
    """True if `text` holds a character outside the invisible categories. Linear in the invisible prefix
    (skipped by `_INVISIBLE_RUN` in C), it stops at the first visible character."""
    at, end = 0, len(text)
    skip = _INVISIBLE_RUN.match
    while True:
        run = skip(text, at)
        at = run.end() if run is not None else at  # a `*` run always matches, if only the empty one
        if at == end:
            return False
        if unicodedata.category(text[at]) not in _INVISIBLE:
            return True
        at += 1  # invisible, but not in the run's class: a character a later Unicode version added


def text_problem(text: str, max_text_chars: int) -> TextProblem | None:
    """The one rule for odd texts, None for a text to label: a text of more than `max_text_chars`
    characters is `text_too_long` (decided by its length alone, before anything reads it); a text with no
    visible character (empty, only whitespace, control, format or separator characters, e.g. only U+200B)
    is `empty_text`. The text itself is never changed. Cost: at most `max_text_chars` characters scanned."""
    if len(text) > max_text_chars:
        return TextProblem(
            DeadLetterKind.TEXT_TOO_LONG,
            f"text is {len(text):,} characters, more than the limit of {max_text_chars:,}",
        )
    if not has_visible_character(text):
        return TextProblem(DeadLetterKind.EMPTY_TEXT, EMPTY_TEXT_REASON)
    return None


class ReviewInput(BaseModel):
    """A review to label, as produced to the reviews topic (v1).

    `text` is required; `id` is optional (integers are accepted and turned into strings); every other
    field is free metadata, copied unchanged to the result's `metadata`.
    """

    SCHEMA_NAME: ClassVar[str] = "review-input"
    SCHEMA_VERSION: ClassVar[int] = 1

    model_config = ConfigDict(
        extra="allow",
        frozen=True,
        title="ReviewInput",
        json_schema_extra={
            "description": (
                "A review to label, the value of one record on the reviews topic, UTF-8 encoded JSON. "
                "Fields other than `text` and `id` are metadata passed through to the result."
            ),
        },
    )

    text: StrictStr = Field(
        min_length=1,
        # JSON Schema patterns are unanchored: "contains a non-whitespace character" (an approximation of
        # `text_problem`'s rule, which also refuses only-format characters such as U+200B).
        json_schema_extra={"pattern": "\\S"},
        description=(
            "The review text (any language the model was trained on, usually Chinese). Must contain at "
            "least one visible character; the worker also enforces a configured maximum length."
        ),
    )
    id: StrictStr | None = Field(
        default=None,
        description=(
            "Producer-chosen identifier echoed in the result. Integers are accepted and converted to "
            "their decimal string. When absent or null the result id is `{topic}/{partition}/{offset}`."
        ),
        json_schema_extra={"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
    )

    @field_validator("id", mode="before")
    @classmethod
    def _coerce_int_id(cls, value: Any) -> Any:
        """Accept int ids (not bools) as their decimal string; leave other types to fail as wrong type."""
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("text")
    @classmethod
    def _text_not_blank(cls, value: str) -> str:
        """Reject a text with no visible character (`text_problem`'s rule); the text is kept as given."""
        if not has_visible_character(value):
            raise ValueError(EMPTY_TEXT_REASON)
        return value

    @property
    def metadata(self) -> dict[str, Any]:
        """The free metadata: every field other than `text` and `id`."""
        return dict(self.model_extra or {})
