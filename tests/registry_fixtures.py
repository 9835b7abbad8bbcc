"""The schema registry of the integration tests (Apicurio Registry), started with deploy/registry/launcher.py.

The registry is, in order of preference:
1. ``SCHEMA_REGISTRY_URL`` when set: its Confluent-compatible API (`make test` starts one on port 18081 and
   sets it to http://localhost:18081/apis/ccompat/v7);
2. a registry started with the launcher on a free port, stopped at session end.
There is no skip: without a registry the tests fail with the reason. `FakeRegistry` is a registry that
misbehaves (slow, HTML, `{}`, invalid schemas), a real HTTP server of the test's own.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.kafka_fixtures import load_script
from worker.bench.worker_process import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
REGISTRY_LAUNCHER = REPO_ROOT / "deploy" / "registry" / "launcher.py"
# Covers a first-time Maven download of the registry (142 MB) plus its start-up.
REGISTRY_UP_TIMEOUT_S = 600.0


def load_registry_launcher() -> ModuleType:
    """Import deploy/registry/launcher.py (not a package) as the module ``registry_launcher``."""
    return load_script("registry_launcher", REGISTRY_LAUNCHER)


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


class FakeRegistry:
    """A small real HTTP server in a thread standing in for a Schema Registry that misbehaves, for the tests
    of the worker's registry client. `GET /schemas/ids/{id}` answers `schemas[id]` (a JSON object) in
    `mode` "ok" (404 with error code 40403 for an id it lacks, after `delay_s`; a bare 404 for any other
    path), or in "html" (200, a web page), "empty" (200, `{}`), "trickle" (200, then the body a byte every
    `trickle_s` seconds, for as long as it is read). `requests` lists the paths asked. A context manager:
    it listens on a free port of 127.0.0.1 from entry to exit."""

    def __init__(self) -> None:
        self.schemas: dict[int, dict[str, Any]] = {}
        self.mode = "ok"
        self.delay_s = 0.0
        self.trickle_s = 1.0
        self.requests: list[str] = []
        self._closing = threading.Event()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-registry", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeRegistry:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def answer(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        self.requests.append(handler.path)
        found = re.fullmatch(r"/schemas/ids/(\d+)(\?.*)?", handler.path)
        if self.mode == "html":
            self._send(handler, 200, "text/html", b"<html><body><h1>Welcome to nginx!</h1></body></html>")
        elif self.mode == "empty":
            self._send(handler, 200, "application/json", b"{}")
        elif self.mode == "trickle":
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", "1000000")
            handler.end_headers()
            while not self._closing.wait(self.trickle_s):
                try:
                    handler.wfile.write(b" ")
                    handler.wfile.flush()
                except OSError:
                    return
        elif found is None:  # not the registry's API: a web server's own 404 page
            self._send(handler, 404, "text/html", b"<html><body>Not Found</body></html>")
        elif int(found.group(1)) in self.schemas:
            self._send(
                handler, 200, "application/json", json.dumps(self.schemas[int(found.group(1))]).encode()
            )
        else:
            self._closing.wait(self.delay_s)
            body = json.dumps({"error_code": 40403, "message": "Schema not found"}).encode()
            self._send(handler, 404, "application/json", body)

    @staticmethod
    def _send(
        handler: http.server.BaseHTTPRequestHandler, status: int, content_type: str, body: bytes
    ) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


def _handler(registry: FakeRegistry) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            registry.answer(self)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the http.server name
            pass

    return Handler
