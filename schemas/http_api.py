"""The HTTP contract of `POST /v1/sentiment`: one text or a list of texts in, one result per text out, in
request order, with the fields a Kafka result carries (label, label_id, confidence, probabilities, model)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator, model_validator

from schemas.sentiment_result import ModelRef

# An id as the Kafka input takes it: a string, or an integer turned into its decimal string.
_ID_SCHEMA: dict[str, Any] = {"anyOf": [{"type": "string"}, {"type": "integer"}]}


def _coerce_id(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


class SentimentRequest(BaseModel):
    """Reviews to label: `text` (one) or `texts` (several), with optional ids echoed in the results.

    The server also bounds the number of texts and the body size (its settings), and applies the one rule
    for odd texts (`schemas.review_input.text_problem`): a bad text of `texts` gets its own error."""

    SCHEMA_NAME: ClassVar[str] = "sentiment-request"
    SCHEMA_VERSION: ClassVar[int] = 1

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        title="SentimentRequest",
        json_schema_extra={
            "description": "Reviews to label: `text` or `texts` (not both), optional `id` / `ids`.",
            "examples": [
                {"texts": ["外卖送得很快，饭菜还是热的", "等了两个小时，菜都凉了"], "ids": ["a", "b"]}
            ],
        },
    )

    text: StrictStr | None = Field(default=None, min_length=1, description="One review.")
    id: StrictStr | None = Field(
        default=None, description="Id of `text`, echoed in its result.", json_schema_extra=_ID_SCHEMA
    )
    texts: list[StrictStr] | None = Field(
        default=None,
        min_length=1,
        description="Reviews; an empty, blank or over-long one gets its own error, the others a label.",
    )
    ids: list[StrictStr] | None = Field(
        default=None,
        description="Ids of `texts` (same length), echoed in their results; default: their positions.",
        json_schema_extra={"items": _ID_SCHEMA},
    )

    @field_validator("id", mode="before")
    @classmethod
    def _coerce_int_id(cls, value: Any) -> Any:
        return _coerce_id(value)

    @field_validator("ids", mode="before")
    @classmethod
    def _coerce_int_ids(cls, value: Any) -> Any:
        return [_coerce_id(v) for v in value] if isinstance(value, list) else value

    @model_validator(mode="after")
    def _one_shape(self) -> SentimentRequest:
        if (self.text is None) == (self.texts is None):
            raise ValueError("give either `text` (one review) or `texts` (a list of reviews)")
        if self.texts is None and self.ids is not None:
            raise ValueError("`ids` goes with `texts`; with `text` use `id`")
        if self.text is None and self.id is not None:
            raise ValueError("`id` goes with `text`; with `texts` use `ids`")
        if self.texts is not None and self.ids is not None and len(self.ids) != len(self.texts):
            raise ValueError(f"`ids` has {len(self.ids)} entries for {len(self.texts)} texts")
        return self

    def items(self) -> list[tuple[str, str]]:
        """(id, text) per review, in request order; ids default to the position ("0", "1", ...)."""
        if self.text is not None:
            return [(self.id if self.id is not None else "0", self.text)]
        texts = self.texts or []
        ids = self.ids if self.ids is not None else [str(i) for i in range(len(texts))]
        return list(zip(ids, texts, strict=True))


class ItemError(BaseModel):
    """Why one review got no label (the HTTP form of a dead letter)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field(
        description="A dead-letter kind, e.g. `empty_text`, `text_too_long`, `too_long_for_memory`, "
        "`inference_failed`."
    )
    reason: str = Field(description="What went wrong.")


class TextSentiment(BaseModel):
    """The label of one review of the request, or the error that kept it from one."""

    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_serialization_defaults_required=True)

    id: str = Field(description="The request's id for this review, or its position.")
    label: str | None = Field(default=None, description='The chosen label, e.g. "positive"; null on error.')
    label_id: int | None = Field(default=None, ge=0, description="Index of the label in the model's list.")
    confidence: float | None = Field(default=None, ge=0.0, le=1.0, description="Probability of the label.")
    probabilities: dict[str, float] | None = Field(
        default=None, description="Probability per label name, summing to 1 (up to rounding)."
    )
    error: ItemError | None = Field(default=None, description="Set when this review got no label.")


class Timing(BaseModel):
    """Where the request's time went, in milliseconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total_ms: float = Field(ge=0.0, description="From the request being accepted to its answer.")
    queue_ms: float = Field(ge=0.0, description="Waiting for a batch and for the model.")
    inference_ms: float = Field(
        ge=0.0, description="Model time of the batches that held this request's texts (shared with others)."
    )
    batch_texts: int = Field(
        ge=0,
        description="Texts labelled together with this request's (it included); 0 when none of its texts "
        "was labelled.",
    )


class SentimentResponse(BaseModel):
    """The answer of `POST /v1/sentiment`: one result per review, in request order."""

    SCHEMA_NAME: ClassVar[str] = "sentiment-response"
    SCHEMA_VERSION: ClassVar[int] = 1

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        title="SentimentResponse",
        json_schema_serialization_defaults_required=True,
    )

    schema_name: Literal["sentiment-response"] = Field(default="sentiment-response")
    schema_version: Literal[1] = Field(default=1)
    model: ModelRef = Field(description="The model that produced the labels.")
    results: list[TextSentiment] = Field(description="One per review, in request order.")
    timing: Timing = Field(description="Where the time went.")


class ErrorResponse(BaseModel):
    """Why a request was refused (4xx/5xx)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    error: str = Field(
        description="invalid_request, unauthorized, too_many_texts, body_too_large, unsupported_media_type, "
        "text_too_long, overloaded, timeout, not_ready or stopping."
    )
    reason: str = Field(description="What to change, in words.")
