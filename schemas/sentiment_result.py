"""The output contract: one record on the results topic per successfully labelled review."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class ModelRef(BaseModel):
    """Which model produced a label."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Model name, e.g. `ernie-3.0-mini-zh-sentiment`.")
    version: str = Field(
        description="Model version or weights fingerprint; changes whenever labels may change."
    )


class SourceRef(BaseModel):
    """Where the input record came from (Kafka coordinates)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str = Field(description="Input topic name.")
    partition: int = Field(ge=0, description="Input partition.")
    offset: int = Field(ge=0, description="Input record offset within the partition.")
    timestamp_ms: int | None = Field(
        default=None,
        description="Input record timestamp (epoch milliseconds, as set by the producer or broker); "
        "null when the record carried none.",
    )


class SentimentResult(BaseModel):
    """A sentiment label for one review (v1), the value of one record on the results topic."""

    SCHEMA_NAME: ClassVar[str] = "sentiment-result"
    SCHEMA_VERSION: ClassVar[int] = 1

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        title="SentimentResult",
        # Fields with defaults are always written, so downstream schemas list them as required.
        json_schema_serialization_defaults_required=True,
        json_schema_extra={
            "description": (
                "The sentiment label of one review, the UTF-8 JSON value of one record on the results "
                "topic. Results of one input partition are published in input offset order."
            ),
        },
    )

    schema_name: Literal["sentiment-result"] = Field(
        default="sentiment-result", description="Contract name; always `sentiment-result`."
    )
    schema_version: Literal[1] = Field(
        default=1, description="Contract version; incremented on breaking changes."
    )
    id: str = Field(
        description="The input `id` (integers as decimal strings); when the input had none, "
        "`{topic}/{partition}/{offset}` of the input record."
    )
    label: str = Field(description='The chosen label, e.g. "positive" or "negative".')
    label_id: int = Field(ge=0, description="Index of the chosen label in the model's label list.")
    confidence: float = Field(ge=0.0, le=1.0, description="Probability of the chosen label, 0..1.")
    probabilities: dict[str, float] = Field(
        description="Probability per label name, each 0..1, summing to 1 (up to rounding)."
    )
    model: ModelRef = Field(description="The model that produced the label.")
    source: SourceRef = Field(description="Kafka coordinates of the input record.")
    processing_time_ms: float = Field(
        ge=0.0,
        description="Milliseconds from consuming the input record to building this result "
        "(decode, batching wait and inference).",
    )
    processed_at_ms: int = Field(description="When this result was built, epoch milliseconds.")
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="Input fields other than `text` and `id`, copied unchanged.",
    )
