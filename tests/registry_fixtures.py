"""The schema registry of the integration tests (Apicurio Registry), started with deploy/registry/launcher.py.

The registry is, in order of preference:
1. ``SCHEMA_REGISTRY_URL`` when set: its Confluent-compatible API (`make test` starts one on port 18081 and
   sets it to http://localhost:18081/apis/ccompat/v7);
2. a registry started with the launcher on a free port, stopped at session end.
There is no skip: without a registry the tests fail with the reason.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from worker.bench.worker_process import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
REGISTRY_LAUNCHER = REPO_ROOT / "deploy" / "registry" / "launcher.py"
# Covers a first-time Maven download of the registry (142 MB) plus its start-up.
REGISTRY_UP_TIMEOUT_S = 600.0


def load_registry_launcher() -> ModuleType:
    """Import deploy/registry/launcher.py (not a package) as the module ``registry_launcher``."""
    if "registry_launcher" in sys.modules:
        return sys.modules["registry_launcher"]
    spec = importlib.util.spec_from_file_location("registry_launcher", REGISTRY_LAUNCHER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["registry_launcher"] = module  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(module)
    return module


_STARTED: dict[tuple[str, ...], None] = {}
"""Where-arguments (``--port``, ``--data-dir``, ``--pid-file``) of registries the tests started and have not
stopped yet, in start order: `stop_left_registries` stops them at the session's end."""


def run_registry_launcher(
    *args: str, timeout_s: float = REGISTRY_UP_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run the registry launcher CLI with this interpreter; output captured as text. A call the launcher's
    parser refuses (exit 2 with its usage) fails the test at once: a `down` it did not understand stops
    nothing, and its registry would outlive the session."""
    proc = subprocess.run(
        [sys.executable, str(REGISTRY_LAUNCHER), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode == 2 and "usage:" in proc.stderr:
        pytest.fail(f"deploy/registry/launcher.py refused {list(args)}:\n{proc.stderr}", pytrace=False)
    where = _where(args[1:])
    if args[:1] == ("up",) and proc.returncode == 0:
        _STARTED[where] = None
    elif args[:1] == ("down",) and proc.returncode == 0:
        _STARTED.pop(where, None)
    return proc


def _where(args: Sequence[str]) -> tuple[str, ...]:
    """The arguments that name one registry (its port, data dir and pid file), normalised."""
    named = {"--port": "8081", "--data-dir": "", "--pid-file": ""}
    for flag, value in zip(args, args[1:], strict=False):
        if flag in named:
            named[flag] = str(Path(value).resolve()) if flag != "--port" else value
    return tuple(part for flag, value in named.items() if value for part in (flag, value))


def stop_left_registries() -> list[str]:
    """Stops every registry a test started and did not stop (a test that failed before its `down`); returns
    what it stopped, one line each (the session reports them: a test should stop what it starts)."""
    stopped = []
    for where in reversed(list(_STARTED)):
        proc = run_registry_launcher("down", *where, timeout_s=60)
        stopped.append(f"{' '.join(where)}: {(proc.stdout + proc.stderr).strip().splitlines()[-1:]}")
    return stopped


@contextlib.contextmanager
def launched_registry(data_dir: Path, port: int | None = None) -> Iterator[str]:
    """A registry of its own (schemas in ``data_dir``, a free port unless given); yields its URL and stops
    it on exit."""
    common = ["--port", str(port or free_port()), "--data-dir", str(data_dir)]
    started = time.monotonic()
    up = run_registry_launcher("up", *common)
    if up.returncode != 0:
        run_registry_launcher("down", *common, timeout_s=60)
        pytest.fail(
            f"deploy/registry/launcher.py up failed (exit {up.returncode}):\n{up.stdout}\n{up.stderr}",
            pytrace=False,
        )
    url = up.stdout.split()[-1]
    print(f"\n[registry] launcher registry at {url} in {time.monotonic() - started:.1f} s")
    try:
        yield url
    finally:
        down = run_registry_launcher("down", *common, timeout_s=60)
        assert down.returncode == 0, f"stopping the registry failed:\n{down.stdout}\n{down.stderr}"
