"""Misconfiguration is said at start: SENTIMENT_* variables that are not settings, an open HTTP API, config
files that cannot be read, and environment values that must be JSON."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

import pytest

from tests.worker_commands import run_command
from worker.cli.common import settings_from_args
from worker.cli.main import exit_code
from worker.config import OTHER_ENVIRONMENT, WorkerSettings, environment_warnings, load_settings
from worker.errors import ConfigurationError

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("SENTIMENT_"):
            monkeypatch.delenv(key)


# ----- SENTIMENT_* variables that are not settings -----
@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("SENTIMENT_API_TOKN", "SENTIMENT_API_TOKEN"),
        ("SENTIMENT_BOOTSTRAP_SERVER", "SENTIMENT_BOOTSTRAP_SERVERS"),
        ("SENTIMENT_MAX_BATCH_SISE", "SENTIMENT_MAX_BATCH_SIZE"),
        ("SENTIMENT_CONFIG", "SENTIMENT_CONFIG_FILE"),
    ],
)
def test_an_unknown_variable_is_named_with_the_closest_known_one(name: str, closest: str) -> None:
    warnings = environment_warnings(WorkerSettings(), {name: "x"}, serves_api=False)
    assert warnings == [f"{name} is not a setting and is ignored: did you mean {closest}?"]


def test_an_unknown_variable_like_no_setting_points_to_the_settings_list() -> None:
    warnings = environment_warnings(WorkerSettings(), {"SENTIMENT_ZZZZZZZZZZZZ": "1"}, serves_api=False)
    assert warnings == [
        "SENTIMENT_ZZZZZZZZZZZZ is not a setting and is ignored: see docs/settings.md for the settings"
    ]


def test_settings_and_the_variables_read_on_purpose_do_not_warn() -> None:
    environ = {f"SENTIMENT_{name.upper()}": "x" for name in WorkerSettings.model_fields}
    environ.update(dict.fromkeys(OTHER_ENVIRONMENT, "x"))
    environ.update({"sentiment_input_topic": "x", "PATH": "/bin", "KAFKA_BOOTSTRAP_SERVERS": "x"})
    assert environment_warnings(WorkerSettings(), environ, serves_api=False) == []
    # The names read outside the settings, each where the repository reads it.
    for name, reader in [
        ("SENTIMENT_CONFIG_FILE", "worker/cli/common.py"),
        ("SENTIMENT_BASE_MODEL_CACHE", "worker/training/base_model_fetch.py"),
        ("SENTIMENT_KAFKA_CACHE", "deploy/kafka/launcher.py"),
        ("SENTIMENT_REGISTRY_CACHE", "deploy/registry/launcher.py"),
    ]:
        assert f'"{name}"' in (REPO / reader).read_text(encoding="utf-8"), (name, reader)


# ----- SENTIMENT_KAFKA_EXTRA cannot weaken the connection silently -----
SASL_SSL = {
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_username": "worker",
    "sasl_password": "worker-secret",
}


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"enable.ssl.certificate.verification": False}, ["enable.ssl.certificate.verification: no setting"]),
        (
            {"security.protocol": "PLAINTEXT", "bootstrap.servers": "elsewhere:9092"},
            [
                "security.protocol: set SENTIMENT_SECURITY_PROTOCOL",
                "bootstrap.servers: set SENTIMENT_BOOTSTRAP_SERVERS",
            ],
        ),
        (
            {"metadata.broker.list": "elsewhere:9092"},
            ["metadata.broker.list: set SENTIMENT_BOOTSTRAP_SERVERS"],
        ),
        ({"ssl.ca.location": "/etc/ca.pem"}, ["ssl.ca.location: set SENTIMENT_SSL_CA_LOCATION"]),
        ({"sasl.password": "other-secret"}, ["sasl.password: set SENTIMENT_SASL_PASSWORD"]),
        ({"ssl.endpoint.identification.algorithm": "none"}, ["SENTIMENT_SSL_ENDPOINT_IDENTIFICATION"]),
        ({"transactional.id": "someone-else"}, ["transactional.id: no setting: exactly_once derives it"]),
        ({"sasl.oauthbearer.config": "x", "ssl.keystore.location": "k.p12"}, ["sasl.oauthbearer.config: no"]),
        ({"plugin.library.paths": "libevil"}, ["plugin.library.paths: no setting: it loads native code"]),
    ],
)
def test_kafka_extra_keys_that_change_security_are_refused_naming_the_setting_to_use(
    extra: dict[str, object], named: list[str]
) -> None:
    """Before: accepted without a word, and librdkafka connected with them."""
    with pytest.raises(ValueError, match="SENTIMENT_KAFKA_EXTRA sets") as refused:
        WorkerSettings(**SASL_SSL, kafka_extra=extra)  # type: ignore[arg-type]
    said = str(refused.value)
    assert all(part in said for part in named), said
    assert "SENTIMENT_ALLOW_KAFKA_EXTRA_OVERRIDES=true" in said
    assert "secret" not in said and "elsewhere" not in said  # keys, never values


def test_other_kafka_extra_keys_pass_through() -> None:
    extra = {"socket.keepalive.enable": True, "message.timeout.ms": 10_000, "client.rack": "eu-1a"}
    settings = WorkerSettings(**SASL_SSL, kafka_extra=extra)  # type: ignore[arg-type]
    assert extra.items() <= settings.librdkafka_common().items()
    assert environment_warnings(settings, {}, serves_api=False) == []


def test_allowed_overrides_reach_librdkafka_and_start_up_names_each_key_never_a_value(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    extra = {"security.protocol": "PLAINTEXT", "bootstrap.servers": "elsewhere:9092", "sasl.password": "p-2"}
    monkeypatch.setenv("SENTIMENT_KAFKA_EXTRA", json.dumps(extra))
    monkeypatch.setenv("SENTIMENT_ALLOW_KAFKA_EXTRA_OVERRIDES", "true")
    for name, value in SASL_SSL.items():
        monkeypatch.setenv(f"SENTIMENT_{name.upper()}", value)
    caplog.set_level(logging.WARNING)
    settings = settings_from_args(argparse.Namespace(command="run"))
    conf = settings.librdkafka_common()
    assert (conf["security.protocol"], conf["bootstrap.servers"], conf["sasl.password"]) == (
        "PLAINTEXT",
        "elsewhere:9092",
        "p-2",
    )
    [warning] = [r for r in caplog.records if "SENTIMENT_KAFKA_EXTRA" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert "overrides security.protocol, bootstrap.servers, sasl.password" in warning.getMessage()
    assert "p-2" not in caplog.text and "elsewhere" not in caplog.text and "worker-secret" not in caplog.text


def test_a_refused_kafka_extra_key_exits_2_with_one_line() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        **{f"SENTIMENT_{name.upper()}": value for name, value in SASL_SSL.items()},
        "SENTIMENT_KAFKA_EXTRA": '{"enable.ssl.certificate.verification": false}',
    }
    proc = run_command("run", env=env)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "SENTIMENT_KAFKA_EXTRA sets enable.ssl.certificate.verification" in line


# ----- an open HTTP API -----
def test_an_api_without_a_token_is_a_warning_naming_the_variable() -> None:
    settings = WorkerSettings()
    (warning,) = environment_warnings(settings, {}, serves_api=True)
    assert warning.startswith("the HTTP API is open: SENTIMENT_API_TOKEN is not set")
    assert "127.0.0.1:9108" in warning
    (blank,) = environment_warnings(
        WorkerSettings(api_token=" "), {"SENTIMENT_API_TOKEN": " "}, serves_api=True
    )
    assert blank.startswith("the HTTP API is open: SENTIMENT_API_TOKEN is blank")
    assert environment_warnings(WorkerSettings(api_token="s3cret"), {}, serves_api=True) == []
    assert environment_warnings(settings, {}, serves_api=False) == []


@pytest.mark.parametrize(
    ("command", "env", "warned"),
    [
        ("serve", {}, True),
        ("serve", {"SENTIMENT_API_TOKEN": ""}, True),
        ("serve", {"SENTIMENT_API_TOKEN": "s3cret"}, False),
        ("run", {}, False),
        ("run", {"SENTIMENT_HTTP_API": "true"}, True),
        ("run", {"SENTIMENT_HTTP_API": "true", "SENTIMENT_HTTP_PORT": "0"}, False),
    ],
)
def test_the_command_line_logs_an_open_api_once(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    command: str,
    env: dict[str, str],
    warned: bool,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with caplog.at_level(logging.WARNING, logger="worker"):
        settings_from_args(argparse.Namespace(command=command, config=None))
    open_lines = [r for r in caplog.records if "the HTTP API is open" in r.getMessage()]
    assert len(open_lines) == (1 if warned else 0)
    assert all(r.levelno == logging.WARNING and "SENTIMENT_API_TOKEN" in r.getMessage() for r in open_lines)


def test_a_typo_is_one_line_on_stderr_of_the_command(tmp_path: Path) -> None:
    """Before: SENTIMENT_API_TOKN=typo left the API open with no word in the log."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("SENTIMENT_")}
    env["SENTIMENT_API_TOKN"] = "typo"
    out = run_command("serve", "--http-port", "0", env=env)
    assert out.returncode == 2  # serve refuses port 0; the warning came first
    lines = out.stderr.splitlines()
    assert "SENTIMENT_API_TOKN is not a setting and is ignored: did you mean SENTIMENT_API_TOKEN?" in lines
    assert "typo" not in out.stderr  # the value, perhaps a secret, is never printed


# ----- config files -----
def test_a_config_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    config = tmp_path / "worker.json"
    config.write_bytes('{"group_id": "gruppe-\u00fc"}'.encode("latin-1"))
    with pytest.raises(ValueError, match=f"config file {config} is not UTF-8 text \\(byte 21\\)"):
        load_settings(config)


def test_a_fifo_as_config_file_is_refused_without_waiting(tmp_path: Path) -> None:
    """Before: reading the FIFO blocked until something wrote to it (forever)."""
    fifo = tmp_path / "worker.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=f"config file {fifo} is not a regular file"):
        load_settings(fifo)


def test_a_directory_as_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"config file {tmp_path} is not a regular file"):
        load_settings(tmp_path)


def test_an_upper_case_toml_suffix_is_read_as_toml(tmp_path: Path) -> None:
    """Before: worker.TOML was parsed as JSON and refused."""
    config = tmp_path / "worker.TOML"
    config.write_text('group_id = "from-toml"\n', encoding="utf-8")
    assert load_settings(config).group_id == "from-toml"


# ----- environment values that must be JSON -----
@pytest.mark.parametrize(
    ("name", "value", "example"),
    [
        ("SENTIMENT_HTTP_CORS_ORIGINS", "https://reviews.example.com", '["https://reviews.example.com"]'),
        ("SENTIMENT_KAFKA_EXTRA", "socket.keepalive.enable=true", '{"socket.keepalive.enable": true}'),
    ],
)
def test_a_json_variable_that_is_not_json_is_named_with_an_example(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, example: str
) -> None:
    """Before: 'error parsing value for field "http_cors_origins" from source "EnvSettingsSource"'."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as caught:
        settings_from_args(argparse.Namespace(command="run", config=None))
    message = str(caught.value)
    assert message == f"{name} must be JSON, e.g. {name}='{example}'"
    assert exit_code(caught.value) == 2
