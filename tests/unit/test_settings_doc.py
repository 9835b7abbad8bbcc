"""docs/settings.md and the README's short settings table are what docs/settings_table.py makes of
worker/config/fields.py now (a new or changed setting without `make docs` fails here), and the generator names
environment variables and defaults as pydantic-settings reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from tests.kafka_fixtures import load_script
from worker.config import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]


gen = load_script("settings_table", ROOT / "docs" / "settings_table.py")


def test_committed_settings_docs_are_current() -> None:
    stale = [str(path.relative_to(ROOT)) for path in gen.stale_files()]
    assert not stale, f"{stale} differ from worker/config/fields.py: run `make docs` and commit the result"


def test_settings_doc_has_one_row_per_setting_in_class_order() -> None:
    rows = [line for line in gen.settings_doc().splitlines() if line.startswith("| `SENTIMENT_")]
    names = [line.split("`")[1] for line in rows]
    assert names == [f"SENTIMENT_{name.upper()}" for name in WorkerSettings.model_fields]


def test_readme_table_holds_the_most_used_settings() -> None:
    readme = gen.README.read_text(encoding="utf-8")
    short = readme.split(gen.START, 1)[1].split(gen.END, 1)[0]
    assert [line.split("`")[1] for line in short.splitlines() if line.startswith("| `")] == [
        f"SENTIMENT_{name.upper()}" for name in gen.MOST_USED
    ]


def test_defaults_are_shown_as_a_user_writes_them() -> None:
    fields = WorkerSettings.model_fields
    shown = {name: gen.default_text(name, fields[name]) for name in fields}
    assert shown["worker_id"] == "the host name"  # never this machine's name
    assert shown["kafka_extra"] == "`{}`"
    assert shown["http_cors_origins"] == "`[]`"
    assert shown["use_bf16"] == "`false`"
    assert shown["sasl_password"] == "unset"
    assert shown["max_batch_tokens"] == "`4096`"
    assert shown["delivery"] == "`at_least_once`"


class _Example(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EXAMPLE_")

    plain: int = Field(3, description="A plain setting | with a pipe.")
    aliased: str = Field("x", validation_alias="OTHER_NAME", description="Read from OTHER_NAME.")
    undocumented: int = 1
    computed: str = Field(default_factory=lambda: "now", description="Computed at start-up.")


def test_env_names_follow_the_prefix_and_aliases_as_pydantic_settings_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fields = _Example.model_fields
    assert gen.env_names("plain", fields["plain"], _Example) == ["EXAMPLE_PLAIN"]
    assert gen.env_names("aliased", fields["aliased"], _Example) == ["OTHER_NAME"]
    monkeypatch.setenv("EXAMPLE_PLAIN", "7")
    monkeypatch.setenv("OTHER_NAME", "y")
    settings = _Example()
    assert (settings.plain, settings.aliased) == (7, "y")


def test_a_pipe_in_a_description_does_not_split_the_row() -> None:
    line = gen.row("plain", _Example.model_fields["plain"], _Example)
    assert line == "| `EXAMPLE_PLAIN` | `3` | A plain setting \\| with a pipe. |\n"


def test_a_setting_without_description_or_with_an_unknown_factory_is_an_error() -> None:
    with pytest.raises(ValueError, match="description"):
        gen.row("undocumented", _Example.model_fields["undocumented"], _Example)
    with pytest.raises(ValueError, match="FACTORY_DEFAULTS"):
        gen.default_text("computed", _Example.model_fields["computed"])
    with pytest.raises(ValueError, match="not settings"):
        gen.table(["plain", "nope"], _Example)


def test_readme_markers_are_required() -> None:
    with pytest.raises(ValueError, match="settings-table"):
        gen.readme_with_table("# a README without markers\n")
