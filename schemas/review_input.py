"""The input contract: one review per Kafka record value (JSON mode)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator


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
        # JSON Schema patterns are unanchored: "contains a non-whitespace character".
        json_schema_extra={"pattern": "\\S"},
        description=(
            "The review text (any language the model was trained on, usually Chinese). Must contain at "
            "least one non-whitespace character; the worker also enforces a configured maximum length."
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
        """Reject whitespace-only text; the text itself is kept exactly as given."""
        if value.isspace():
            raise ValueError("text must contain at least one non-whitespace character")
        return value

    @property
    def metadata(self) -> dict[str, Any]:
        """The free metadata: every field other than `text` and `id`."""
        return dict(self.model_extra or {})
