"""Kafka fixtures: one real broker per test session, unique names, topic creation.

Loaded from tests/conftest.py via ``pytest_plugins``. The broker is, in order of preference:
1. ``KAFKA_BOOTSTRAP_SERVERS`` when set (a broker you run yourself);
2. an ``apache/kafka`` container when a Docker engine answers (testcontainers);
3. a local broker started with deploy/kafka/launcher.py on free ports, stopped at session end.
There is no skip: without a broker the tests fail with the reason.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from worker.bench.worker_process import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = REPO_ROOT / "deploy" / "kafka" / "launcher.py"
KAFKA_IMAGE = "apache/kafka:4.1.1"
# Covers a first-time Maven download of the broker jars plus the broker's own startup.
LAUNCHER_UP_TIMEOUT_S = 600.0

CreateTopics = Callable[..., list[str]]
DLQ_CONFIG = {"max.message.bytes": str(2 * 1024 * 1024)}
"""The output and dead-letter topics' config `topics create` sets: a dead letter of the largest input fits,
so the worker's start-up check passes."""


def load_script(name: str, path: Path) -> ModuleType:
    """Import the script at `path` (not in a package) as the module `name`, once."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(module)
    return module


def load_launcher() -> ModuleType:
    """Import deploy/kafka/launcher.py (not a package) as the module ``kafka_launcher``."""
    return load_script("kafka_launcher", LAUNCHER)


def run_launcher(*args: str, timeout_s: float = LAUNCHER_UP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run the launcher CLI with this interpreter; output captured as text."""
    return subprocess.run(
        [sys.executable, str(LAUNCHER), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def private_broker(
    data_dir: Path, *up_args: str, secrets: Sequence[str] = (), timeout_s: str = "120"
) -> Iterator[str]:
    """A broker of its own (launcher `up` with `up_args`, data in `data_dir`), stopped on exit; yields the
    launcher's output. Start-up output must not show any of `secrets` nor private key material."""
    common = ["--data-dir", str(data_dir), "--pid-file", str(data_dir / "broker.pid")]
    up = run_launcher("up", *up_args, *common, "--timeout-s", timeout_s)
    output = up.stdout + up.stderr
    assert up.returncode == 0, f"the broker did not start:\n{up.stdout}\n{up.stderr}"
    for secret in secrets:
        assert secret not in output  # the launcher does not print passwords
    assert "PRIVATE KEY" not in output
    try:
        yield output
    finally:
        down = run_launcher("down", *common, timeout_s=90)
        assert down.returncode == 0, down.stdout + down.stderr


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # no SDK, no socket, daemon down: all mean "no Docker"
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address ``host:port`` of the session's broker."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    if _docker_answers():
        yield from _container_broker()
        return
    yield from _launcher_broker(tmp_path_factory.mktemp("kafka-session"))


def _container_broker() -> Iterator[str]:
    # testcontainers' KafkaContainer drives the confluentinc/cp-kafka image's scripts; apache/kafka is
    # configured by env instead. A fixed host port lets the advertised listener name the mapped port.
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    port = free_port()
    container = (
        DockerContainer(KAFKA_IMAGE)
        .with_bind_ports(9092, port)
        .with_env("KAFKA_NODE_ID", "1")
        .with_env("KAFKA_PROCESS_ROLES", "broker,controller")
        .with_env("KAFKA_LISTENERS", "PLAINTEXT://:9092,CONTROLLER://:9093")
        .with_env("KAFKA_ADVERTISED_LISTENERS", f"PLAINTEXT://localhost:{port}")
        .with_env("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER")
        .with_env("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT")
        .with_env("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9093")
        .with_env("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
        .with_env("KAFKA_NUM_PARTITIONS", "1")
        .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
        .waiting_for(LogMessageWaitStrategy("Kafka Server started").with_startup_timeout(120))
    )
    with container:
        yield f"localhost:{port}"


def _launcher_broker(data_dir: Path) -> Iterator[str]:
    port, controller_port = free_port(), free_port()
    pid_file = data_dir / "broker.pid"
    started = time.monotonic()
    up = run_launcher(
        "up",
        "--port",
        str(port),
        "--controller-port",
        str(controller_port),
        "--data-dir",
        str(data_dir),
        "--pid-file",
        str(pid_file),
        "--timeout-s",
        "120",
    )
    if up.returncode != 0:
        run_launcher("down", "--pid-file", str(pid_file), "--data-dir", str(data_dir), timeout_s=60)
        pytest.fail(
            "no Kafka broker for the integration tests: KAFKA_BOOTSTRAP_SERVERS is unset, no Docker "
            f"engine answers, and deploy/kafka/launcher.py up failed (exit {up.returncode}):\n"
            f"{up.stdout}\n{up.stderr}",
            pytrace=False,
        )
    print(f"\n[kafka] launcher broker at {up.stdout.split()[-1]} in {time.monotonic() - started:.1f} s")
    try:
        yield up.stdout.split()[-1]
    finally:
        down = run_launcher("down", "--pid-file", str(pid_file), "--data-dir", str(data_dir), timeout_s=60)
        assert down.returncode == 0, f"stopping the session broker failed:\n{down.stdout}\n{down.stderr}"


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """Factory of per-test unique topic/group names: ``unique_name("reviews") -> "reviews-1a2b3c4d"``."""

    def make(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"

    return make


@pytest.fixture
def create_topics(kafka_bootstrap: str) -> Iterator[CreateTopics]:
    """``create_topics(names, partitions=1, config=None) -> names``: create topics (with topic `config`) and
    wait until every partition has a leader (auto-creation is off). The topics are deleted after the test.
    `DLQ_CONFIG` makes a dead-letter topic as `topics create` does."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    created: list[str] = []

    def create(
        names: str | Sequence[str], partitions: int = 1, config: dict[str, str] | None = None
    ) -> list[str]:
        wanted = [names] if isinstance(names, str) else list(names)
        futures = admin.create_topics(
            [
                NewTopic(n, num_partitions=partitions, replication_factor=1, config=config or {})
                for n in wanted
            ]
        )
        for future in futures.values():
            future.result(timeout=30)
        created.extend(wanted)
        _wait_for_leaders(admin, wanted, partitions, timeout_s=30.0)
        return wanted

    yield create
    if created:
        for future in admin.delete_topics(created, operation_timeout=10).values():
            try:
                future.result(timeout=30)
            except KafkaException as exc:  # the test deleted it itself (`topics delete`)
                if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise


def _wait_for_leaders(admin: AdminClient, topics: Sequence[str], partitions: int, timeout_s: float) -> None:
    # CreateTopics returns once the controller has the topic; producers need the partition leaders too.
    deadline = time.monotonic() + timeout_s
    while True:
        metadata = admin.list_topics(timeout=10)
        ready = all(
            t in metadata.topics
            and metadata.topics[t].error is None
            and len(metadata.topics[t].partitions) == partitions
            and all(p.leader >= 0 for p in metadata.topics[t].partitions.values())
            for t in topics
        )
        if ready:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"topics {list(topics)} have no leader for every partition after {timeout_s} s"
            )
        time.sleep(0.1)
