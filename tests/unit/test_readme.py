"""The README documents every setting (a new setting without a README row fails here)."""

from __future__ import annotations

from pathlib import Path

from worker.config import WorkerSettings

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_setting_has_a_row_in_the_readme_table() -> None:
    text = README.read_text(encoding="utf-8")
    missing = [name for name in WorkerSettings.model_fields if f"| `SENTIMENT_{name.upper()}` |" not in text]
    assert not missing, f"add these settings to README.md's table: {missing}"


def test_readme_shows_the_two_quick_start_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text and "make test" in text
