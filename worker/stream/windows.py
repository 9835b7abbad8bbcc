"""A window of consumed messages on its way through the stages: decoded on the poll thread (`prepare_window`),
its valid reviews' texts submitted to the engine, then turned into one outbound record per input
(`window_records`)."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.dead_letter import DeadLetterKind
from worker.config import REGISTRY_FORMATS, WorkerSettings
from worker.inference.labelling import InferenceFailure, Output
from worker.stream.decode import DecodedReview, DecodeFailure, InputFormat, decode_review
from worker.stream.partitions import PartitionBook
from worker.stream.producer import OutboundRecord
from worker.stream.records import InputMessage, OutboundRecords
from worker.stream.registry_decode import RegistryDecoder


@dataclass(frozen=True)
class DecodeOptions:
    """What decoding a consumed value needs of the settings."""

    input_format: InputFormat  # json or text; a registry format's values go through `registry` instead
    max_value_bytes: int
    max_text_chars: int
    max_json_depth: int
    text_field: str = "text"
    id_field: str = "id"
    registry: RegistryDecoder | None = None  # the avro, json_schema and protobuf formats decode with it

    @classmethod
    def from_settings(
        cls, settings: WorkerSettings, registry: RegistryDecoder | None = None
    ) -> DecodeOptions:
        """`registry`: the decoder of a registry input format (built by the caller: it holds a client)."""
        if (settings.input_format in REGISTRY_FORMATS) != (registry is not None):
            raise ValueError(f"input_format={settings.input_format} and a registry decoder go together")
        return cls(
            input_format="text" if settings.input_format == "text" else "json",
            max_value_bytes=settings.max_value_bytes,
            max_text_chars=settings.max_text_chars,
            max_json_depth=settings.max_json_depth,
            text_field=settings.text_field,
            id_field=settings.id_field,
            registry=registry,
        )


@dataclass(frozen=True)
class PreparedWindow:
    """Messages in consume order, each decoded."""

    items: list[InputMessage]
    decoded: list[DecodedReview | DecodeFailure]

    @property
    def texts(self) -> list[str]:
        """The valid reviews' texts, in order: what the engine labels."""
        return [d.text for d in self.decoded if isinstance(d, DecodedReview)]


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
    decoded: list[DecodedReview | DecodeFailure] = [
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
    outputs: list[Output],
    book: PartitionBook,
    outbound: OutboundRecords,
    now: float,
) -> list[OutboundRecord]:
    """One record per input whose partition is still ours (`book`), in input order: its result, or its dead
    letter (built by `outbound`; `now` on the worker's clock). `outputs`: the engine's, one per valid
    review."""
    records: list[OutboundRecord] = []
    predictions = iter(outputs)
    for item, review in zip(prepared.items, prepared.decoded, strict=True):
        output = next(predictions) if isinstance(review, DecodedReview) else None
        if not book.owns((item.position.topic, item.position.partition), item.epoch):
            continue  # its partition was revoked meanwhile: uncommitted, so the new owner labels it
        if isinstance(review, DecodeFailure):
            records.append(outbound.dead_letter(item, review.kind, review.reason))
        elif isinstance(output, InferenceFailure):
            records.append(outbound.dead_letter(item, output.kind, output.reason))
        else:
            assert output is not None
            records.append(outbound.result(item, review, output, now))
    return records
