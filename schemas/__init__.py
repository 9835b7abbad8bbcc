"""Versioned contracts of the sentiment worker: Kafka messages, dead-letter headers and the HTTP API
(pydantic v2 models + exported JSON Schema); the review input's decoding, which every front door shares
(`review_decode`); the result's Avro and Protobuf twins (`registry_schemas`, the `.proto` reader
`proto_text`)."""

from schemas.dead_letter import (
    DLQ_VERSION,
    HEADER_DLQ_VERSION,
    HEADER_ERROR_KIND,
    HEADER_ERROR_REASON,
    HEADER_PREFIX,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TIMESTAMP_MS,
    HEADER_SOURCE_TOPIC,
    HEADER_WORKER_ID,
    DeadLetterInfo,
    DeadLetterKind,
    build_dead_letter_headers,
    parse_dead_letter_headers,
)
from schemas.http_api import (
    ErrorResponse,
    ItemError,
    SentimentRequest,
    SentimentResponse,
    TextSentiment,
    Timing,
)
from schemas.review_input import ReviewInput
from schemas.sentiment_result import ModelRef, SentimentResult, SourceRef

__all__ = [
    "DLQ_VERSION",
    "HEADER_DLQ_VERSION",
    "HEADER_ERROR_KIND",
    "HEADER_ERROR_REASON",
    "HEADER_PREFIX",
    "HEADER_SOURCE_OFFSET",
    "HEADER_SOURCE_PARTITION",
    "HEADER_SOURCE_TIMESTAMP_MS",
    "HEADER_SOURCE_TOPIC",
    "HEADER_WORKER_ID",
    "DeadLetterInfo",
    "DeadLetterKind",
    "ErrorResponse",
    "ItemError",
    "ModelRef",
    "ReviewInput",
    "SentimentRequest",
    "SentimentResponse",
    "SentimentResult",
    "SourceRef",
    "TextSentiment",
    "Timing",
    "build_dead_letter_headers",
    "parse_dead_letter_headers",
]
