"""Building blocks of the fault scenarios: worker processes, a background feeder and output collector,
a private broker, and the conservation tally (inputs, results, dead letters, duplicates, lost)."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Message, Producer

from tests.integration.helpers import worker_env  # noqa: F401 (part of the harness API)
from tests.kafka_fixtures import DLQ_CONFIG, free_port, run_launcher
from tests.polling import wait_until
from worker.bench.worker_process import WorkerProcess  # noqa: F401 (part of the harness API)

REPO = Path(__file__).resolve().parents[2]
Record = tuple[bytes, bytes | None]  # (key = the input's unique id, value)


# --------------------------------------------------------------------------- input and output


def review(i: int, prefix: str) -> Record:
    """A valid JSON review with the unique id ``{prefix}-{i:05d}`` as key and `id`."""
    texts = (
        "质量很好，物流也快，非常满意",
        "太差了，用了两天就坏了",
        "一般般吧，价格还可以",
        "客服态度很好，下次还来",
    )
    rid = f"{prefix}-{i:05d}"
    value = json.dumps({"id": rid, "text": texts[i % len(texts)], "seq": i}, ensure_ascii=False)
    return rid.encode(), value.encode()


def produce_all(bootstrap: str, topic: str, records: Sequence[Record], **conf: Any) -> None:
    """Produces every record (keyed, so a key always lands on the same partition) and waits for acks."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, **conf})
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    deadline = time.monotonic() + 120
    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
                break
            except BufferError:  # the local queue is full: serve delivery reports until it has room
                assert time.monotonic() < deadline, "test producer: queue still full after 120 s"
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(60)
    assert left == 0 and not errors, f"test producer: {left} undelivered, errors {errors[:3]}"


class Feeder(threading.Thread):
    """Produces `records` in chunks of `chunk` every `pause_s` seconds, in the background."""

    def __init__(
        self, bootstrap: str, topic: str, records: Sequence[Record], chunk: int = 50, pause_s: float = 0.1
    ) -> None:
        super().__init__(daemon=True)
        self._args = (bootstrap, topic, records, chunk, pause_s)
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        bootstrap, topic, records, chunk, pause_s = self._args
        try:
            for start in range(0, len(records), chunk):
                produce_all(bootstrap, topic, records[start : start + chunk])
                self.sent += len(records[start : start + chunk])
                time.sleep(pause_s)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test via `finish()`
            self.error = exc

    def finish(self, timeout_s: float = 120.0) -> None:
        self.join(timeout_s)
        assert not self.is_alive(), "the feeder did not finish"
        if self.error is not None:
            raise self.error


@dataclass(frozen=True)
class OutRecord:
    """A record read back from the output or dead-letter topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]

    def json(self) -> dict[str, Any]:
        return dict(json.loads(self.value or b"null"))


def _out_record(m: Message) -> OutRecord:
    topic, partition, offset, key, value = m.topic(), m.partition(), m.offset(), m.key(), m.value()
    assert topic is not None and partition is not None and offset is not None  # data messages have them
    headers: dict[str, bytes] = {}
    for header in m.headers() or []:
        name, v = header[0], header[1]
        headers[str(name)] = _as_bytes(v) or b""
    return OutRecord(topic, partition, offset, _as_bytes(key), _as_bytes(value), headers)


def _as_bytes(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


class Collector(threading.Thread):
    """Reads topics from the beginning in the background (read_committed) and keeps every record."""

    def __init__(self, bootstrap: str, topics: Sequence[str], **conf: Any) -> None:
        super().__init__(daemon=True)
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"fault-collector-{time.monotonic_ns()}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.message.max.bytes": 2 * 1024 * 1024,
                "log_level": 0,  # broker outages are expected here; the worker's own log is what matters
                **conf,
            }
        )
        self._consumer.subscribe(list(topics))
        self._lock = threading.Lock()
        self._records: list[OutRecord] = []
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                batch = [_out_record(m) for m in self._consumer.consume(500, 0.2) if m.error() is None]
                with self._lock:
                    self._records.extend(batch)
        finally:
            self._consumer.close()

    def records(self, topic: str | None = None) -> list[OutRecord]:
        with self._lock:
            return [r for r in self._records if topic is None or r.topic == topic]

    def count(self, topic: str | None = None) -> int:
        return len(self.records(topic))

    def distinct_keys(self) -> set[bytes | None]:
        return {r.key for r in self.records()}

    def wait_until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
            time.sleep(0.1)

    def settle(self, quiet_s: float = 1.5, timeout_s: float = 30.0) -> None:
        """Waits until no new record arrived for `quiet_s` seconds (to catch late duplicates)."""
        deadline = time.monotonic() + timeout_s
        last, since = self.count(), time.monotonic()
        while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.count()
            if now != last:
                last, since = now, time.monotonic()

    def close(self) -> None:
        self._halt.set()
        self.join(30)


@contextmanager
def collecting(bootstrap: str, names: dict[str, str]) -> Iterator[Collector]:
    """A started Collector of the results and dead-letter topics of `names`, closed on the way out."""
    collector = Collector(bootstrap, [names["results"], names["dlq"]])
    collector.start()
    try:
        yield collector
    finally:
        collector.close()


@contextmanager
def running(
    env: dict[str, str], log_dir: Path, name: str, *args: str, **kwargs: Any
) -> Iterator[WorkerProcess]:
    """A worker process (`WorkerProcess(env, log_dir, name, *args, **kwargs)`), stopped on the way out."""
    worker = WorkerProcess(env, log_dir, name, *args, **kwargs)
    try:
        yield worker
    finally:
        worker.stop()


def stop_when_settled(collector: Collector, worker: WorkerProcess) -> None:
    """Waits until no late output arrives, then stops `worker` with SIGTERM: it must exit 0."""
    collector.settle()
    worker.terminate()
    assert worker.wait(60) == 0, worker.stderr_tail()


# --------------------------------------------------------------------------- figures


@dataclass
class Figures:
    """Conservation figures of one scenario; `lost` and `duplicates` count ids."""

    scenario: str
    inputs: int
    results: int
    dead_letters: int
    duplicates: int
    lost: int
    notes: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.notes.items())
        return (
            f"[fault] {self.scenario}: inputs={self.inputs} results={self.results} "
            f"dead_letters={self.dead_letters} duplicates={self.duplicates} lost={self.lost}"
            + (f" {extra}" if extra else "")
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tally(
    scenario: str, input_keys: Iterable[bytes], results: Sequence[OutRecord], dead: Sequence[OutRecord]
) -> Figures:
    """Counts by id (the record key): distinct results and dead letters, extra copies, ids with neither."""
    inputs = set(input_keys)
    copies = Counter(r.key for r in [*results, *dead])
    unknown = set(copies) - inputs
    assert not unknown, f"outputs for ids never produced: {list(unknown)[:5]}"
    return Figures(
        scenario=scenario,
        inputs=len(inputs),
        results=len({r.key for r in results}),
        dead_letters=len({r.key for r in dead}),
        duplicates=sum(n - 1 for n in copies.values()),
        lost=len(inputs - set(copies)),
    )


def tally_outputs(
    scenario: str, records: Sequence[Record], collector: Collector, names: dict[str, str]
) -> Figures:
    """`tally` of `records` against what `collector` read from the results and dead-letter topics."""
    results, dead = collector.records(names["results"]), collector.records(names["dlq"])
    return tally(scenario, [key for key, _ in records], results, dead)


def duplicated_keys(records: Sequence[OutRecord]) -> set[bytes | None]:
    return {key for key, n in Counter(r.key for r in records).items() if n > 1}


def source_offsets_by_partition(results: Sequence[OutRecord]) -> dict[tuple[str, int], list[int]]:
    """Input offsets of the results, per input partition, in the order they appear in the output."""
    by_source: dict[tuple[str, int], list[tuple[int, int, int]]] = defaultdict(list)
    for r in results:
        src = r.json()["source"]
        by_source[(src["topic"], src["partition"])].append((r.partition, r.offset, src["offset"]))
    return {key: [o for _p, _off, o in sorted(rows)] for key, rows in by_source.items()}


@dataclass(frozen=True)
class FaultScene:
    """What every fault scenario starts from: the broker, fresh topics, the tiny model, a folder for the
    workers' logs, and the figures' record."""

    bootstrap: str
    topics: Callable[..., dict[str, str]]  # see `fault_topics`
    model_dir: Path
    log_dir: Path
    record: Callable[[Figures], None]  # see `record_figures`


# --------------------------------------------------------------------------- a broker of one's own


class PrivateBroker:
    """A launcher broker on free ports in its own data dir, for tests that stop and restart it."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port, self.controller_port = free_port(), free_port()
        self.bootstrap = f"localhost:{self.port}"

    def _args(self) -> list[str]:
        return ["--data-dir", str(self.data_dir), "--pid-file", str(self.data_dir / "broker.pid")]

    def up(self) -> None:
        args = ["up", "--port", str(self.port), "--controller-port", str(self.controller_port), *self._args()]
        proc = run_launcher(*args, "--timeout-s", "300")  # a loaded machine starts Kafka slowly
        assert proc.returncode == 0, f"private broker did not start:\n{proc.stdout}\n{proc.stderr}"

    def log(self) -> str:
        """The broker's log (all its starts), for failure messages."""
        path = self.data_dir / "broker.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def down(self) -> None:
        proc = run_launcher("down", *self._args(), timeout_s=90)
        assert proc.returncode == 0, f"private broker did not stop:\n{proc.stdout}\n{proc.stderr}"


# What the worker needs once the broker answers again: the group coordinator loads the group, which still
# lists this worker's old member (its session timed out on the client during the outage) until that
# member's session timeout (10 s) passes; then the worker rejoins and is assigned its partitions. Seen
# here: 10.3-10.6 s after the broker started, idle or beside two CPU hogs. One CI run (2026-12-02) was not
# ready 120 s after; a timeout now reports /readyz, the worker's thread stacks and the coordinator's log.
# A deadline, not a speed check.
RECOVERY_DEADLINE_S = 240.0


@contextmanager
def broker_up(data_dir: Path) -> Iterator[PrivateBroker]:
    """A private broker in `data_dir`, started, and stopped on the way out."""
    broker = PrivateBroker(data_dir)
    broker.up()
    try:
        yield broker
    finally:
        broker.down()


def readyz(worker: WorkerProcess) -> tuple[int, dict[str, object]]:
    """(status, checks) of the worker's /readyz; fails the test at once if the worker has died."""
    assert worker.alive(), f"the worker died during the outage:\n{_log_without_reconnects(worker, 40)}"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{worker.http_port}/readyz", timeout=2) as response:
            return int(response.status), dict(json.loads(response.read()))
    except urllib.error.HTTPError as exc:
        return exc.code, dict(json.loads(exc.read() or b"{}"))
    except OSError:
        return 0, {}


def _log_without_reconnects(worker: WorkerProcess, lines: int) -> str:
    """The last `lines` of the worker's log without librdkafka's reconnect errors, which fill it during an
    outage (several per second)."""
    kept = [line for line in worker.stderr().splitlines() if "Connection refused" not in line]
    return "\n".join(kept[-lines:])


def wait_ready_again(worker: WorkerProcess, broker: PrivateBroker, group: str, timeout_s: float) -> None:
    """Polls /readyz until 200; on timeout fails with what the worker reported last, its log without the
    reconnect noise, and what the broker's group coordinator logged about the group."""
    deadline = time.monotonic() + timeout_s
    status, checks = readyz(worker)
    while status != 200:
        if time.monotonic() >= deadline:
            worker.proc.send_signal(signal.SIGUSR1)  # every thread's stack into its log: where is it stuck?
            time.sleep(2)
            coordinator = [line for line in broker.log().splitlines() if group in line]
            raise AssertionError(
                f"the worker was not ready {timeout_s:g} s after the broker came back; last /readyz: "
                f"{status} {checks}\nworker log (reconnect errors left out):\n"
                + _log_without_reconnects(worker, 80)
                + "\nbroker, about the group:\n"
                + "\n".join(coordinator[-15:])
            )
        time.sleep(0.2)
        status, checks = readyz(worker)


def private_topics(bootstrap: str, prefix: str) -> dict[str, str]:
    """Fresh reviews (3 partitions), results (3) and dead-letter topics and a group name on `bootstrap` (a
    private broker's: the session's `fault_topics` make them on the shared one)."""
    suffix = uuid.uuid4().hex[:8]
    names = {k: f"{prefix}-{k}-{suffix}" for k in ("reviews", "results", "dlq", "group")}
    make_topics(bootstrap, {names["reviews"]: 3, names["results"]: 3, names["dlq"]: 1}, dlq=names["dlq"])
    return names


def outage_mid_stream(
    broker: PrivateBroker,
    worker: WorkerProcess,
    collector: Collector,
    names: dict[str, str],
    records: Sequence[Record],
    first: int,
    outage_seen: Callable[[], bool],
    every_id_s: float,
) -> tuple[int, float]:
    """Feeds `records[:first]`, stops `broker` once outputs flow and starts it again once `outage_seen()`,
    waits until the worker is ready again, feeds the rest and waits up to `every_id_s` for every id; then
    stops the worker (exit 0). Returns the outputs before the outage and the seconds until ready again."""
    wait_for_log(worker, "assigned")
    # A backlog, so the broker goes away while the worker is busy with it.
    produce_all(broker.bootstrap, names["reviews"], records[:first])
    collector.wait_until(lambda: collector.count() >= 100, 120, "outputs before the outage")
    outputs_before = collector.count()
    broker.down()
    wait_until(outage_seen, 60, "the worker to see the outage")
    broker.up()
    back_at = time.monotonic()
    wait_ready_again(worker, broker, names["group"], timeout_s=RECOVERY_DEADLINE_S)
    recovery_s = time.monotonic() - back_at
    produce_all(broker.bootstrap, names["reviews"], records[first:])
    collector.wait_until(
        lambda: len(collector.distinct_keys()) >= len(records) or not worker.alive(), every_id_s, "every id"
    )
    assert worker.alive(), f"the worker died after the outage:\n{worker.stderr_tail()}"
    stop_when_settled(collector, worker)
    return outputs_before, recovery_s


def wait_for_log(worker: WorkerProcess, needle: str, timeout_s: float = 300.0) -> None:
    """Waits until `needle` appears in the worker's stderr (e.g. "assigned"); fails if it exits first.
    The deadline is generous: a loaded machine loads the model slowly (seen: over 120 s)."""
    deadline = time.monotonic() + timeout_s
    while needle not in worker.stderr():
        assert worker.alive(), f"{worker.name} exited ({worker.proc.returncode}):\n{worker.stderr_tail()}"
        assert time.monotonic() < deadline, f"{worker.name}: no {needle!r} in the log after {timeout_s:.0f} s"
        time.sleep(0.2)


def make_topics(bootstrap: str, partitions: dict[str, int], *, dlq: str | None = None) -> None:
    """Creates topics (name → partitions) on `bootstrap` and waits until every partition has a leader;
    `dlq` (one of them) gets the dead-letter topic's config `topics create` sets."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [
            NewTopic(n, num_partitions=p, replication_factor=1, config=DLQ_CONFIG if n == dlq else {})
            for n, p in partitions.items()
        ]
    )
    for future in futures.values():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        topics = admin.list_topics(timeout=10).topics
        if all(
            n in topics
            and topics[n].error is None
            and len(topics[n].partitions) == p
            and all(x.leader >= 0 for x in topics[n].partitions.values())
            for n, p in partitions.items()
        ):
            return
        assert time.monotonic() < deadline, f"topics {list(partitions)} have no leaders after 30 s"
        time.sleep(0.1)


def first_seen_in_order(offsets: Sequence[int]) -> bool:
    """True when the offsets, each counted at its first appearance only, increase (replays are tolerated)."""
    seen: set[int] = set()
    firsts = []
    for offset in offsets:
        if offset not in seen:
            seen.add(offset)
            firsts.append(offset)
    return firsts == sorted(firsts)
