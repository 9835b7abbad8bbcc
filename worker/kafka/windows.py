"""A window of consumed messages on its way through the stages: decoded on the poll thread
(`prepare_window`), its valid reviews handed to the Labeller, then turned into one outbound record per input
(`window_records`)."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.dead_letter import DeadLetterKind
from schemas.review_decode import DecodeFailure, InputFormat, decode_review
from schemas.review_input import Review
from worker.config import REGISTRY_FORMATS, LimitsSettings, RegistrySettings
from worker.inference.classifier import InferenceFailure
from worker.kafka.partitions import PartitionBook
from worker.kafka.producer import OutboundRecord
from worker.kafka.records import InputMessage, OutboundRecords
from worker.kafka.registry_decode import RegistryDecoder
from worker.labelling.labeller import Predictions


@dataclass(frozen=True)
class DecodeOptions:
    """What decoding a consumed value needs of the settings (the registry section and the input limits)."""

    input_format: InputFormat  # json or text; a registry format's values go through `registry` instead
    max_value_bytes: int
    max_text_chars: int
    max_json_depth: int
    text_field: str = "text"
    id_field: str = "id"
    registry: RegistryDecoder | None = None  # the avro, json_schema and protobuf formats decode with it

    @classmethod
    def from_settings(
        cls, formats: RegistrySettings, limits: LimitsSettings, registry: RegistryDecoder | None = None
    ) -> DecodeOptions:
        """`registry`: the decoder of a registry input format (built by the caller: it holds a client)."""
        if (formats.input_format in REGISTRY_FORMATS) != (registry is not None):
            raise ValueError(f"input_format={formats.input_format} and a registry decoder go together")
        return cls(
            input_format="text" if formats.input_format == "text" else "json",
            max_value_bytes=limits.max_value_bytes,
            max_text_chars=limits.max_text_chars,
            max_json_depth=limits.max_json_depth,
            text_field=formats.text_field,
            id_field=formats.id_field,
            registry=registry,
        )


@dataclass(frozen=True)
class PreparedWindow:
    """Messages in consume order, each decoded."""

    items: list[InputMessage]
    decoded: list[Review | DecodeFailure]

    @property
    def reviews(self) -> list[Review]:
        """The valid reviews, in order: what the Labeller labels."""
        return [d for d in self.decoded if isinstance(d, Review)]


def prepare_window(items: list[InputMessage], options: DecodeOptions) -> PreparedWindow:
    """Decodes every message (runs on the poll thread). A registry format raises `RegistryUnavailable`
    when the registry cannot answer for one of them: nothing is decided then, and the caller keeps `items`
    to prepare them again later (the schemas fetched so far stay cached)."""
    if options.registry is not None:
        registry = options.registry
        return PreparedWindow(
            items,
            [
                registry.decode(item.value, item.default_id) if item.unreadable is None else _unreadable(item)
                for item in items
            ],
        )
    decoded: list[Review | DecodeFailure] = [
        decode_review(
            item.value,
            input_format=options.input_format,
            max_value_bytes=options.max_value_bytes,
            max_text_chars=options.max_text_chars,
            max_json_depth=options.max_json_depth,
            default_id=item.default_id,
            text_field=options.text_field,
            id_field=options.id_field,
        )
        if item.unreadable is None
        else _unreadable(item)
        for item in items
    ]
    return PreparedWindow(items, decoded)


def _unreadable(item: InputMessage) -> DecodeFailure:
    """The dead-letter reason of an offset whose record batch the consumer could not read."""
    return DecodeFailure(DeadLetterKind.UNDECODABLE_BATCH, item.unreadable or "unreadable record batch")


def window_records(
    prepared: PreparedWindow,
    predictions: Predictions,
    book: PartitionBook,
    outbound: OutboundRecords,
    now: float,
) -> list[OutboundRecord]:
    """One record per input whose partition is still ours (`book`), in input order: its result, or its dead
    letter (built by `outbound`; `now` on the worker's clock). `predictions`: the Labeller's, one output per
    valid review, and the model that made them."""
    records: list[OutboundRecord] = []
    model = predictions.model
    outputs = iter(predictions.outputs)
    for item, review in zip(prepared.items, prepared.decoded, strict=True):
        output = next(outputs) if isinstance(review, Review) else None
        if not book.owns((item.position.topic, item.position.partition), item.epoch):
            continue  # its partition was revoked meanwhile: uncommitted, so the new owner labels it
        if isinstance(review, DecodeFailure):
            records.append(outbound.dead_letter(item, review.kind, review.reason))
        elif isinstance(output, InferenceFailure):
            records.append(outbound.dead_letter(item, output.kind, output.reason))
        else:
            assert output is not None
            records.append(outbound.result(item, review, output, model, now))
    return records
