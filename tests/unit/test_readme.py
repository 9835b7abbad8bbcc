"""The README documents the settings: every setting has a row in docs/settings.md (generated, see
test_settings_doc.py), which the README links, and the README's quick start names the two commands."""

from __future__ import annotations

from pathlib import Path

from worker.config import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SETTINGS_DOC = ROOT / "docs" / "settings.md"


def test_every_setting_has_a_row_in_the_settings_reference() -> None:
    text = SETTINGS_DOC.read_text(encoding="utf-8")
    missing = [name for name in WorkerSettings.model_fields if f"| `SENTIMENT_{name.upper()}` |" not in text]
    assert not missing, f"run `make docs`: docs/settings.md lacks {missing}"
    assert "(docs/settings.md)" in README.read_text(encoding="utf-8")


def test_readme_shows_the_two_quick_start_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text and "make test" in text
