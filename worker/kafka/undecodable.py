"""Record batches the client cannot decompress or parse, turned into dead letters so their partition moves on.

librdkafka reports such a batch (a compression bomb past `receive.message.max.bytes`, a codec it lacks, a
batch it cannot allocate) as an error event at the batch's *base* offset, fetches it again after
`fetch.error.backoff.ms` and never gets past it: without help the partition is wedged for good. The regular
consumer is not told where the batch ends, so the range is found by seeking:

1. Retry: the same error at the same base offset `undecodable_batch_retries` more times (a batch that
   decodes meanwhile, e.g. once memory is free again, is taken as it is).
2. Probe: seek to offsets after the first and watch what the partition hands over. An error at the same base
   offset means the probe is still inside the batch (a fetch returns the whole batch that holds the offset
   asked for); a message, an error at another base offset, or nothing within `PROBE_TIMEOUT_S` means it is
   past it. Galloping (start+1, +3, +7, ...) then bisecting finds the batch's last offset in O(log n) fetches;
   the partition's high watermark bounds the search.
3. Dead-letter every offset from the first to the last found (one record each, no key and no value: nothing
   of the batch could be read) and seek past them.

Probing never counts an offset past the batch as inside it (only the batch itself answers with its base
offset), so a dead letter is never made for a record that could be read. A probe that times out counts as
past the batch: if it was not, the next fetch meets the batch again and its rest goes the same way (one dead
letter per offset still). Offsets inside the batch that hold no record (compacted away) get a dead letter
too: only the batch's base and last offsets are known, not which offsets between them are used.

Pure bookkeeping on the poll thread: the caller feeds it the consumer's events and carries out what it says.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaError

from worker.kafka.offsets import PartitionKey

__all__ = ["PROBE_TIMEOUT_S", "UNDECODABLE_CODES", "DeadLetterRange", "Seek", "UndecodableBatches"]

log = logging.getLogger(__name__)

UNDECODABLE_CODES = frozenset(
    {
        KafkaError._BAD_COMPRESSION,  # decompression failed or would pass receive.message.max.bytes
        KafkaError._NOT_IMPLEMENTED,  # a compression codec this client lacks
        KafkaError._CRIT_SYS_RESOURCE,  # no memory for the decompressed batch
        KafkaError.MSG_SIZE_TOO_LARGE,  # a batch larger than a fetch may be (receive.message.max.bytes)
    }
)
"""Consumer error events that pin a partition at one offset: librdkafka fetches the same batch again and
fails the same way, for ever."""

PROBE_TIMEOUT_S = 5.0
"""A probe that brings neither a message nor an error of its partition within this counts as past the
batch (e.g. only transaction markers or aborted records follow it)."""


@dataclass(frozen=True)
class Seek:
    """Move the consumer of `key` to `offset` (a probe)."""

    key: PartitionKey
    offset: int


@dataclass(frozen=True)
class DeadLetterRange:
    """Offsets `first`..`last` (inclusive) of `key` could not be read: one dead letter each, then the consumer
    goes on at `last + 1`."""

    key: PartitionKey
    first: int
    last: int
    reason: str


Action = Seek | DeadLetterRange


@dataclass
class _Held:
    """A partition pinned by a batch: what librdkafka reports (`base`), the first offset still to be done
    (`start`, past the base when an earlier round dead-lettered part of the batch), and the search state."""

    base: int
    start: int
    reason: str
    since: float
    errors: int = 1
    inside: int = -1  # the highest offset known to lie in the batch (`start` once probing begins)
    outside: int | None = None  # the lowest offset known to lie past it
    probe: int | None = None  # where the consumer was sent; None while retrying
    probe_at: float = 0.0


class UndecodableBatches:
    """Per partition: retries, then probes for the end of a batch the client cannot read (module docstring).

    `retries`: how many more times the same error is awaited before probing. `high_watermark(key)`: the
    partition's high watermark, or None when unknown (then only probes bound the search). `clock`: the
    caller's seconds."""

    def __init__(
        self,
        retries: int,
        high_watermark: Callable[[PartitionKey], int | None],
        *,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self._retries = retries
        self._high_watermark = high_watermark
        self._probe_timeout_s = probe_timeout_s
        self._held: dict[PartitionKey, _Held] = {}
        self._resume: dict[PartitionKey, int] = {}  # after a round: where the partition went on

    # ----- what the loop asks -----
    def holds(self, key: PartitionKey) -> bool:
        return key in self._held

    def held(self, now: float) -> dict[PartitionKey, tuple[float, str]]:
        """Partitions pinned now: seconds since the first error, and what /readyz says about them."""
        out: dict[PartitionKey, tuple[float, str]] = {}
        for key, held in self._held.items():
            if held.probe is None:
                step = f"fetched {held.errors} of {self._retries + 1} times"
            else:
                step = "finding where the batch ends"
            out[key] = (now - held.since, f"offset {held.start}: {held.reason} ({step})")
        return out

    # ----- consumer events -----
    def error(self, key: PartitionKey, offset: int, reason: str, now: float) -> Action | None:
        """An error event of `key` at `offset` (the batch's base offset) with one of `UNDECODABLE_CODES`."""
        held = self._held.get(key)
        if held is None or (held.probe is None and offset != held.base):
            start = max(offset, self._resume.get(key, offset))
            self._held[key] = _Held(base=offset, start=start, reason=reason, since=now)
            log.warning(
                "%s[%d]: the record batch at offset %d cannot be read (%s); fetching it %d more times, then "
                "its offsets become dead letters (undecodable_batch) and the partition moves on",
                *key,
                start,
                reason,
                self._retries,
            )
            return self._begin_probing(key, now) if self._retries == 0 else None
        if held.probe is None:
            held.errors += 1
            return self._begin_probing(key, now) if held.errors > self._retries else None
        if offset == held.base:
            held.inside = max(held.inside, held.probe)
        elif offset > held.inside:  # another batch's base offset: ours ends before it
            held.outside = min(held.outside if held.outside is not None else offset, offset)
        else:  # from before the last seek
            return None
        return self._next_probe(key, held, now)

    def data(self, key: PartitionKey, offset: int, now: float) -> tuple[bool, Action | None]:
        """A message of `key` at `offset`. Returns (drop it, what to do): a probe's answer is dropped (the
        partition is read again from the batch's end); a message while retrying means the batch was read
        after all, and the partition is no longer held."""
        held = self._held.get(key)
        if held is None:
            return False, None
        if held.probe is None:
            log.info("%s[%d]: the batch at offset %d was read after all", *key, held.start)
            del self._held[key]
            return False, None
        if offset < held.probe:  # from before the last seek
            return True, None
        held.outside = min(held.outside if held.outside is not None else held.probe, held.probe)
        return True, self._next_probe(key, held, now)

    def tick(self, now: float) -> list[Action]:
        """Probes unanswered for `probe_timeout_s` count as past the batch."""
        actions: list[Action] = []
        for key, held in list(self._held.items()):
            if held.probe is not None and now - held.probe_at >= self._probe_timeout_s:
                held.outside = min(held.outside if held.outside is not None else held.probe, held.probe)
                actions.append(self._next_probe(key, held, now))
        return actions

    def forget(self, keys: Iterable[PartitionKey]) -> None:
        """`keys` were rewound, revoked or lost: whatever was found about them no longer holds."""
        for key in keys:
            self._held.pop(key, None)
            self._resume.pop(key, None)

    # ----- the search -----
    def _begin_probing(self, key: PartitionKey, now: float) -> Action:
        held = self._held[key]
        held.inside = held.start
        high = self._high_watermark(key)
        if high is not None and high > held.start:
            held.outside = high  # nothing lies at or past the high watermark
        return self._next_probe(key, held, now)

    def _next_probe(self, key: PartitionKey, held: _Held, now: float) -> Action:
        if held.outside is not None and held.outside <= held.inside + 1:
            del self._held[key]
            self._resume[key] = held.inside + 1
            return DeadLetterRange(key, held.start, held.inside, held.reason)
        gallop = held.inside + (held.inside - held.start + 1)
        bisect = gallop if held.outside is None else (held.inside + held.outside) // 2
        probe = min(gallop, bisect)
        held.probe, held.probe_at = probe, now
        return Seek(key, probe)
