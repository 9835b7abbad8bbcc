"""`sentiment-worker --version` names the installed version (issue 40: there was none)."""

from __future__ import annotations

import importlib.metadata

import pytest

from worker.cli.main import main


def test_version_prints_the_installed_version_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert (
        capsys.readouterr().out.strip()
        == f"sentiment-worker {importlib.metadata.version('sentiment-worker')}"
    )
