"""Where a setting came from (doctor names it for the bootstrap address), and a config file's unknown key
gets the did-you-mean an environment typo gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.config import load_settings, setting_origin
from worker.tools.doctor import bootstrap_check


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("bootstrap_server", "did you mean bootstrap_servers?"),
        ("SENTIMENT_BOOTSTRAP_SERVERS", "did you mean bootstrap_servers?"),
        ("input-topic", "did you mean input_topic?"),
        ("zzz", "see docs/settings.md"),
    ],
)
def test_an_unknown_config_file_key_gets_a_did_you_mean(tmp_path: Path, key: str, hint: str) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(f'{key} = "x"\n', encoding="utf-8")
    with pytest.raises(ValueError) as refused:
        load_settings(config)
    assert f"has unknown settings: {key} ({hint}" in str(refused.value)


def test_the_origin_of_a_setting_follows_the_precedence(tmp_path: Path) -> None:
    config = tmp_path / "worker.toml"
    config.write_text('bootstrap_servers = "kafka-a:9092"\n', encoding="utf-8")
    name = "bootstrap_servers"
    env = {"SENTIMENT_BOOTSTRAP_SERVERS": "kafka-b:9092"}
    assert setting_origin(name, flag_given=True, environ=env, config_file=config) == "--bootstrap-servers"
    assert (
        setting_origin(name, flag_given=False, environ=env, config_file=config)
        == "SENTIMENT_BOOTSTRAP_SERVERS"
    )
    assert setting_origin(name, flag_given=False, environ={}, config_file=config) == f"config file {config}"
    assert setting_origin(name, flag_given=False, environ={}, config_file=None) == (
        "the default (SENTIMENT_BOOTSTRAP_SERVERS not set)"
    )


def test_doctor_names_the_bootstrap_origin_and_warns_of_a_typo_beside_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    origin = "the default (SENTIMENT_BOOTSTRAP_SERVERS not set)"
    assert bootstrap_check("localhost:9092", origin).line() == (
        "[OK  ] bootstrap: localhost:9092 (from the default (SENTIMENT_BOOTSTRAP_SERVERS not set))"
    )
    monkeypatch.setenv("SENTIMENT_BOOTSTRAP_SERVER", "kafka-prod:9092")
    warned = bootstrap_check("localhost:9092", origin)
    assert warned.verdict == "WARN" and "SENTIMENT_BOOTSTRAP_SERVER is set and ignored" in warned.detail
    assert "rename SENTIMENT_BOOTSTRAP_SERVER to SENTIMENT_BOOTSTRAP_SERVERS" in (warned.fix or "")
