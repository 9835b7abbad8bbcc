"""`make demo` as a newcomer meets it: a busy port's hint names `make demo KAFKA_PORT=…`, every command the
demo prints carries the broker address it used, and its last line quotes the served form's own held-out
figure."""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path

import pytest

from tests.kafka_fixtures import load_launcher

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "deploy"))
from demo_accuracy import accuracy_line  # noqa: E402


def test_a_busy_port_hint_names_make_demo_with_kafka_port(tmp_path: Path) -> None:
    launcher = load_launcher()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        cfg = launcher.make_config(port=port, data_dir=tmp_path)
        with pytest.raises(launcher.LauncherError) as refused:
            launcher.ensure_ports_free(cfg)
    said = f"{refused.value} {refused.value.hint}"
    assert f"`make demo KAFKA_PORT={port + 100}`" in said


def test_every_command_the_demo_prints_names_the_broker() -> None:
    script = (ROOT / "deploy" / "demo.sh").read_text(encoding="utf-8")
    printed = [line for line in script.splitlines() if re.match(r'\s*echo "\s+\$cli ', line)]
    assert printed, "the demo prints its clean-up commands"
    for line in printed:
        assert "--bootstrap-servers $bootstrap" in line, line


def test_readme_shows_make_demo_with_kafka_port() -> None:
    assert "make demo KAFKA_PORT=" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_demo_quotes_the_int8_forms_own_figure_not_the_float32_one(tmp_path: Path) -> None:
    training, served = tmp_path / "default", tmp_path / "default-int8"
    training.mkdir()
    served.mkdir()
    (training / "metrics.json").write_text(
        json.dumps({"test_accuracy": 0.8779, "split_sizes": {"test": 2000}}), encoding="utf-8"
    )
    record = {"accuracy": {"texts": 2000, "float32": 0.8779, "int8": 0.8785}}
    (served / "sentiment_model.json").write_text(json.dumps({"quantization": record}), encoding="utf-8")
    (served / "README.md").write_text("# card\n", encoding="utf-8")
    line = accuracy_line(served, training)
    assert f"model {served} (INT8): held-out test accuracy 87.85% on 2000 reviews" in line
    assert f"its model card {served / 'README.md'}" in line and "its float32 source: 87.79%" in line
    plain = accuracy_line(training, training)
    assert plain.startswith(f"model {training}: held-out test accuracy 87.79% on 2000 reviews")
