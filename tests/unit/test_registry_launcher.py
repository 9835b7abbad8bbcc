"""deploy/registry/launcher.py without a registry: the restore order that gives schemas their old ids, the
build cache marker, which processes `down` may signal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.registry_fixtures import REGISTRY_LAUNCHER, load_registry_launcher


@pytest.fixture(scope="module")
def launcher() -> ModuleType:
    return load_registry_launcher()


def snapshot(subjects: dict[str, list[int]]) -> dict[str, Any]:
    """A snapshot whose subjects hold versions 1.. with the given schema ids."""
    return {
        "format": 1,
        "compatibility": "BACKWARD",
        "subjects": {
            name: {
                "compatibility": "BACKWARD",
                "versions": [
                    {"version": n, "id": i, "schemaType": "AVRO", "schema": f"s{i}", "references": []}
                    for n, i in enumerate(ids, start=1)
                ],
            }
            for name, ids in subjects.items()
        },
    }


def replayed(launcher: ModuleType, subjects: dict[str, list[int]]) -> list[tuple[str, int, int]]:
    return [(s, e["version"], e["id"]) for s, e in launcher.replay_order(snapshot(subjects))]


def new_ids_in_order(order: list[tuple[str, int, int]]) -> list[int]:
    """The ids a registry makes, in the order it makes them: each id's first registration."""
    seen: list[int] = []
    for _, _, schema_id in order:
        if schema_id not in seen:
            seen.append(schema_id)
    return seen


def test_replay_keeps_each_subjects_version_order_and_makes_ids_in_order(launcher: ModuleType) -> None:
    # b's v2 reuses a's v1; a's v2 was made after b's v1; c's v1 is the schema first made as a's v2
    subjects = {"a": [1, 3], "b": [2, 1], "c": [3]}
    order = replayed(launcher, subjects)
    assert sorted(order) == sorted((s, n, i) for s, ids in subjects.items() for n, i in enumerate(ids, 1))
    for name in subjects:
        assert [n for s, n, _ in order if s == name] == list(range(1, len(subjects[name]) + 1))
    assert new_ids_in_order(order) == [1, 2, 3]


def test_replay_of_a_subject_whose_later_version_has_a_smaller_id(launcher: ModuleType) -> None:
    # z's v2 is the schema first registered as y's v1 (id 1), after z's v1 made id 2
    order = replayed(launcher, {"z": [2, 1], "y": [1]})
    assert order == [("y", 1, 1), ("z", 1, 2), ("z", 2, 1)]


def test_binary_ready_needs_the_marker_of_this_crate_version(launcher: ModuleType, tmp_path: Path) -> None:
    binary = launcher.binary_path(tmp_path)
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"")
    assert not launcher.binary_ready(tmp_path)  # an interrupted build leaves no marker
    (tmp_path / launcher.MARKER_NAME).write_text("rivven-schema 0.0.1\n")
    assert not launcher.binary_ready(tmp_path)
    (tmp_path / launcher.MARKER_NAME).write_text(f"{launcher.CRATE} {launcher.CRATE_VERSION}\n")
    assert launcher.binary_ready(tmp_path)


def test_only_a_registry_server_command_line_is_signalled(launcher: ModuleType) -> None:
    assert launcher.is_registry(["/cache/bin/rivven-schema", "serve", "--port", "8081"])
    assert not launcher.is_registry(["/cache/bin/rivven-schema", "health"])
    assert not launcher.is_registry(["java", "kafka.Kafka", "serve"])
    assert not launcher.is_registry([])


def test_unknown_snapshot_format_is_refused_before_any_request(launcher: ModuleType) -> None:
    with pytest.raises(launcher.LauncherError, match="unknown snapshot format"):
        launcher.import_snapshot("http://127.0.0.1:9", {"format": 99, "subjects": {}})


def test_up_without_cargo_or_a_built_registry_says_what_to_do(tmp_path: Path) -> None:
    env = {"PATH": "/nonexistent", "CARGO_HOME": str(tmp_path / "no-cargo"), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(REGISTRY_LAUNCHER), "up", "--port", "9", "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 1
    assert "`cargo` is not on PATH" in proc.stderr
    assert "hint: install a recent stable Rust toolchain" in proc.stderr
    assert not (tmp_path / "data" / "registry.pid").exists()
