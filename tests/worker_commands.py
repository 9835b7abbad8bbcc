"""The `python -m worker …` command as the tests run it: from the repository, with the environment given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]


def run_command(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Runs `python -m worker ARGS` to its end; stdin closed, stdout and stderr captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def start_command(
    env: dict[str, str],
    *args: str,
    stdout: int | IO[Any] = subprocess.PIPE,
    stderr: int | IO[Any] = subprocess.PIPE,
) -> subprocess.Popen[str]:
    """Starts `python -m worker ARGS`; output to pipes (as text) unless `stdout`/`stderr` say otherwise."""
    return subprocess.Popen(
        [sys.executable, "-m", "worker", *args], cwd=REPO, env=env, stdout=stdout, stderr=stderr, text=True
    )
