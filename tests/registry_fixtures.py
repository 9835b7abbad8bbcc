"""The schema registry of the integration tests, started with deploy/registry/launcher.py.

The registry is, in order of preference:
1. ``SCHEMA_REGISTRY_URL`` when set (`make test` starts one on port 18081 and sets it);
2. a registry started with the launcher on a free port, stopped at session end.
There is no skip: without a registry the tests fail with the reason.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from worker.bench.worker_process import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
REGISTRY_LAUNCHER = REPO_ROOT / "deploy" / "registry" / "launcher.py"
# Covers a first-time `cargo install` of the registry plus its start-up.
REGISTRY_UP_TIMEOUT_S = 1800.0


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


def run_registry_launcher(
    *args: str, timeout_s: float = REGISTRY_UP_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run the registry launcher CLI with this interpreter; output captured as text."""
    return subprocess.run(
        [sys.executable, str(REGISTRY_LAUNCHER), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def launched_registry(data_dir: Path, port: int | None = None) -> Iterator[str]:
    """A registry of its own (data in ``data_dir``, a free port unless given); yields its URL and stops it
    on exit (``down``, which saves its schemas into ``data_dir``)."""
    common = ["--port", str(port or free_port()), "--data-dir", str(data_dir)]
    started = time.monotonic()
    up = run_registry_launcher("up", *common)
    if up.returncode != 0:
        run_registry_launcher("down", *common, "--no-save", timeout_s=60)
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
