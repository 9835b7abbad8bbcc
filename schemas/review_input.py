"""The input contract: one review per Kafka record value (JSON mode), and the one rule for odd texts that
every front door applies (`text_problem`: the worker, `produce`, `predict` and the HTTP API)."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

from schemas.dead_letter import DeadLetterKind

_INVISIBLE: Final = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})
"""Unicode categories of characters that show nothing: control, format (zero-width spaces and joiners,
direction marks, U+FEFF), and space, line and paragraph separators; every whitespace character is in one."""

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
    """True if `text` holds a character outside the invisible categories (stops at the first visible)."""
    category = unicodedata.category
    return any(category(char) not in _INVISIBLE for char in text)


def text_problem(text: str, max_text_chars: int) -> TextProblem | None:
    """The one rule for odd texts, None for a text to label: a text with no visible character (empty, only
    whitespace, control, format or separator characters, e.g. only U+200B) is `empty_text`; one of more
    than `max_text_chars` characters is `text_too_long`. The text itself is never changed."""
    if not has_visible_character(text):
        return TextProblem(DeadLetterKind.EMPTY_TEXT, EMPTY_TEXT_REASON)
    if len(text) > max_text_chars:
        return TextProblem(
            DeadLetterKind.TEXT_TOO_LONG,
            f"text is {len(text):,} characters, more than the limit of {max_text_chars:,}",
        )
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
