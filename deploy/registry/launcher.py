#!/usr/bin/env python3
"""Start, stop and inspect a local schema registry speaking Confluent's Schema Registry REST API, no Docker.

    python deploy/registry/launcher.py up [--port 8081] [--data-dir DIR]    # prints the URL
    python deploy/registry/launcher.py status [--port 8081]
    python deploy/registry/launcher.py down [--port 8081] [--data-dir DIR]

The server is Rivven's schema registry (the `rivven-schema` crate, Apache-2.0), built once from crates.io with
`cargo install` into a cache directory outside the repository. It keeps schemas in memory; the launcher keeps
them across a restart through the registry's own REST API: `down` saves every subject version, schema id and
compatibility level to ``<data-dir>/schemas.json`` before stopping it, and `up` registers them again in an
order that gives every schema its old id, and fails when one does not. Stdlib only; importable, so tests can
call the small functions below directly.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

CRATE = "rivven-schema"
CRATE_VERSION = "0.0.22"
BINARY = "rivven-schema"
HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
MARKER_NAME = ".complete"
SNAPSHOT_NAME = "schemas.json"
SNAPSHOT_FORMAT = 1
LOG_TAIL_LINES = 40
EXIT_NOT_RUNNING = 3  # LSB status code for "program is not running"
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

Say = Callable[[str], None]


def _kafka_launcher() -> ModuleType:
    """deploy/kafka/launcher.py (process and pid-file helpers shared with the broker's launcher)."""
    if "kafka_launcher" in sys.modules:
        return sys.modules["kafka_launcher"]
    spec = importlib.util.spec_from_file_location("kafka_launcher", HERE.parent / "kafka" / "launcher.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kafka_launcher"] = module  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(module)
    return module


_kafka = _kafka_launcher()
pid_alive = _kafka.pid_alive
read_pid = _kafka.read_pid
port_in_use = _kafka.port_in_use
process_command_line = _kafka.process_command_line
tail = _kafka.tail


class LauncherError(Exception):
    """A launcher step failed; ``hint`` says what to try next."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class RegistryConfig:
    """Where one local registry runs; ``port`` is a TCP port on ``host``."""

    port: int
    data_dir: Path
    pid_file: Path
    log_file: Path
    host: str = "127.0.0.1"
    advertised_host: str = "localhost"

    @property
    def url(self) -> str:
        """The URL clients use (confluent-kafka's ``SchemaRegistryClient({"url": ...})``)."""
        return f"http://{self.advertised_host}:{self.port}"

    @property
    def local_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def snapshot_file(self) -> Path:
        """The schemas saved by `down` and registered again by `up`."""
        return self.data_dir / SNAPSHOT_NAME


def make_config(
    port: int = 8081,
    data_dir: Path | None = None,
    pid_file: Path | None = None,
    log_file: Path | None = None,
) -> RegistryConfig:
    """Fill in the defaults: data in ``<repo>/var/registry-<port>``."""
    data = (data_dir or REPO_ROOT / "var" / f"registry-{port}").resolve()
    return RegistryConfig(
        port=port,
        data_dir=data,
        pid_file=(pid_file or data / "registry.pid").resolve(),
        log_file=(log_file or data / "registry.log").resolve(),
    )


def default_cache_dir(env: Mapping[str, str]) -> Path:
    """``$SENTIMENT_REGISTRY_CACHE`` or ``~/.cache/sentiment-worker/rivven-schema-<version>``."""
    override = env.get("SENTIMENT_REGISTRY_CACHE")
    if override:
        return Path(override).expanduser().resolve()
    return Path.home() / ".cache" / "sentiment-worker" / f"{CRATE}-{CRATE_VERSION}"


# --------------------------------------------------------------------------- build


def binary_path(cache_dir: Path) -> Path:
    return cache_dir / "bin" / BINARY


def binary_ready(cache_dir: Path) -> bool:
    """True when ``cache_dir`` holds a complete build of this crate version."""
    marker = cache_dir / MARKER_NAME
    return (
        marker.is_file()
        and marker.read_text().strip() == f"{CRATE} {CRATE_VERSION}"
        and binary_path(cache_dir).is_file()
    )


def find_cargo(env: Mapping[str, str]) -> str:
    """`cargo` from PATH, else rustup's default place (``~/.cargo/bin``), which a non-login shell may miss."""
    found = shutil.which("cargo", path=env.get("PATH"))
    if found:
        return found
    fallback = Path(env.get("CARGO_HOME") or Path.home() / ".cargo") / "bin" / "cargo"
    if fallback.is_file():
        return str(fallback)
    raise LauncherError(
        "`cargo` is not on PATH (the registry is built from crates.io with `cargo install`)",
        "install a recent stable Rust toolchain with cargo (rustup; Debian bookworm's is too old), "
        "or put a built `rivven-schema` binary in <cache-dir>/bin and the marker file beside it",
    )


def cargo_command(cargo: str, root: Path) -> list[str]:
    # --locked: the crate's own Cargo.lock, so every machine builds the same dependency versions.
    return [cargo, "install", CRATE, "--version", CRATE_VERSION, "--locked", "--root", str(root)]


def ensure_binary(
    cache_dir: Path, env: Mapping[str, str], say: Say = print, progress_every_s: float = 20.0
) -> Path:
    """Build the registry with ``cargo install`` into ``cache_dir`` unless a complete build is there.

    Cargo installs into a scratch root renamed into place, then a marker is written, so an interrupted build
    is never mistaken for a complete one. Returns the binary.
    """
    if binary_ready(cache_dir):
        return binary_path(cache_dir)
    cargo = find_cargo(env)
    cache_dir.mkdir(parents=True, exist_ok=True)
    scratch = cache_dir / "root.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    build_log = cache_dir / "cargo.log"
    say(
        f"Building {CRATE} {CRATE_VERSION} from crates.io into {cache_dir} "
        "(several minutes the first time; later starts reuse it)..."
    )
    started = time.monotonic()
    with build_log.open("wb") as log:
        proc = subprocess.Popen(
            cargo_command(cargo, scratch),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
        )
        while True:
            try:
                rc = proc.wait(timeout=progress_every_s)
                break
            except subprocess.TimeoutExpired:
                crates = build_log.read_text(errors="replace").count("Compiling ")
                elapsed = time.monotonic() - started
                say(f"  ... cargo still building ({elapsed:.0f} s, {crates} crates compiled)")
    if rc != 0 or not (scratch / "bin" / BINARY).is_file():
        raise LauncherError(
            f"cargo install failed (exit {rc}) building {CRATE} {CRATE_VERSION}:\n"
            + tail(build_log, LOG_TAIL_LINES),
            f"check crates.io access and the Rust toolchain (full log: {build_log})",
        )
    (cache_dir / "bin").mkdir(exist_ok=True)
    binary_path(cache_dir).unlink(missing_ok=True)
    (scratch / "bin" / BINARY).rename(binary_path(cache_dir))
    shutil.rmtree(scratch, ignore_errors=True)
    (cache_dir / MARKER_NAME).write_text(f"{CRATE} {CRATE_VERSION}\n")
    say(f"{CRATE} built ({time.monotonic() - started:.0f} s): {binary_path(cache_dir)}")
    return binary_path(cache_dir)


# --------------------------------------------------------------------------- REST


class RegistryHttpError(Exception):
    """The registry answered with an error status; ``status`` and ``body`` are its answer."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path} -> HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body


def request(base_url: str, method: str, path: str, body: Any = None, timeout_s: float = 10.0) -> Any:
    """One JSON request to the registry; returns the decoded answer, raises RegistryHttpError on >= 400."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base_url + path, data=data, method=method)
    req.add_header("Accept", CONTENT_TYPE)
    if data is not None:
        req.add_header("Content-Type", CONTENT_TYPE)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raise RegistryHttpError(method, path, exc.code, exc.read().decode(errors="replace")) from None
    return json.loads(raw) if raw else None


def registry_answers(base_url: str, timeout_s: float = 2.0) -> bool:
    """True when ``GET /subjects`` answers 200 (the registry is ready for clients)."""
    try:
        request(base_url, "GET", "/subjects", timeout_s=timeout_s)
    except (OSError, RegistryHttpError, ValueError):
        return False
    return True


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


# --------------------------------------------------------------------------- snapshot


def export_snapshot(base_url: str) -> dict[str, Any]:
    """Every subject's versions (id, type, schema, references) and compatibility level, and the global one."""
    subjects: dict[str, Any] = {}
    for subject in sorted(request(base_url, "GET", "/subjects")):
        versions = []
        for number in sorted(request(base_url, "GET", f"/subjects/{_quote(subject)}/versions")):
            got = request(base_url, "GET", f"/subjects/{_quote(subject)}/versions/{number}")
            # A subject version's answer may leave the references out; the schema's own answer has them.
            by_id = request(base_url, "GET", f"/schemas/ids/{int(got['id'])}")
            versions.append(
                {
                    "version": int(got["version"]),
                    "id": int(got["id"]),
                    "schemaType": got.get("schemaType") or "AVRO",
                    "schema": got["schema"],
                    "references": got.get("references") or by_id.get("references") or [],
                }
            )
        level = request(base_url, "GET", f"/config/{_quote(subject)}")["compatibilityLevel"]
        subjects[subject] = {"compatibility": level, "versions": versions}
    global_level = request(base_url, "GET", "/config")["compatibilityLevel"]
    return {"format": SNAPSHOT_FORMAT, "compatibility": global_level, "subjects": subjects}


def replay_order(snapshot: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(subject, version entry) in an order that registers each schema id where it was first made.

    A registry gives a new schema the next id and an already known schema its old one, and a subject's
    versions are numbered in registration order. So: take versions subject by subject in version order,
    always the waiting one with the smallest id; ids then come back in their old order.
    """
    queues = {name: list(entry["versions"]) for name, entry in snapshot["subjects"].items()}
    order: list[tuple[str, dict[str, Any]]] = []
    while any(queues.values()):
        subject = min(
            (name for name, q in queues.items() if q), key=lambda name: (queues[name][0]["id"], name)
        )
        order.append((subject, queues[subject].pop(0)))
    return order


def import_snapshot(base_url: str, snapshot: Mapping[str, Any]) -> int:
    """Register a saved snapshot into an empty registry; returns the number of subject versions.

    Compatibility is NONE while registering (each version was accepted once), then each subject's saved level
    and the global one are set. Raises LauncherError when an id or version number does not come back.
    """
    if snapshot.get("format") != SNAPSHOT_FORMAT:
        raise LauncherError(f"unknown snapshot format {snapshot.get('format')!r}", "remove the snapshot file")
    if request(base_url, "GET", "/subjects"):
        raise LauncherError("the registry already holds subjects; not restoring the snapshot over them")
    request(base_url, "PUT", "/config", {"compatibility": "NONE"})
    order = replay_order(snapshot)
    for subject, entry in order:
        body: dict[str, Any] = {"schema": entry["schema"], "schemaType": entry["schemaType"]}
        if entry["references"]:
            body["references"] = entry["references"]
        got_id = request(base_url, "POST", f"/subjects/{_quote(subject)}/versions", body)["id"]
        got = request(base_url, "GET", f"/subjects/{_quote(subject)}/versions/latest")
        if int(got_id) != entry["id"] or int(got["version"]) != entry["version"]:
            raise LauncherError(
                f"restoring {subject} version {entry['version']} gave id {got_id} version {got['version']}, "
                f"not id {entry['id']} (were schemas deleted?)",
                "clients holding the old ids would decode wrongly: delete the snapshot to start empty",
            )
    for subject, entry in snapshot["subjects"].items():
        request(base_url, "PUT", f"/config/{_quote(subject)}", {"compatibility": entry["compatibility"]})
    request(base_url, "PUT", "/config", {"compatibility": snapshot["compatibility"]})
    return len(order)


def save_snapshot(cfg: RegistryConfig) -> int:
    """Write the running registry's schemas to the data dir (atomically); returns the subject versions."""
    snapshot = export_snapshot(cfg.local_url)
    scratch = cfg.snapshot_file.with_suffix(".partial")
    scratch.write_text(json.dumps(snapshot, indent=1, sort_keys=True) + "\n")
    scratch.replace(cfg.snapshot_file)
    return sum(len(entry["versions"]) for entry in snapshot["subjects"].values())


# --------------------------------------------------------------------------- lifecycle


def start_command(binary: Path, cfg: RegistryConfig) -> list[str]:
    return [str(binary), "serve", "--host", cfg.host, "--port", str(cfg.port), "--log-level", "info"]


def start(cfg: RegistryConfig, binary: Path) -> int:
    """Start the registry detached (own session, output appended to the log file); return its pid."""
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    with cfg.log_file.open("ab") as log:
        log.write(
            f"\n===== launcher: starting registry at {time.strftime('%Y-%m-%d %H:%M:%S')} =====\n".encode()
        )
        log.flush()
        proc = subprocess.Popen(
            start_command(binary, cfg),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cfg.data_dir,
            start_new_session=True,  # survives the launcher and the terminal's Ctrl-C
        )
    cfg.pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


def is_registry(argv: Sequence[str]) -> bool:
    """True for a ``.../rivven-schema serve ...`` command line."""
    return bool(argv) and Path(argv[0]).name == BINARY and "serve" in argv[1:]


def running_registry(cfg: RegistryConfig) -> int | None:
    """The pid of the live registry named by the pid file, if any."""
    pid = read_pid(cfg.pid_file)
    if pid is None or not pid_alive(pid):
        return None
    argv = process_command_line(pid)
    return pid if argv is not None and is_registry(argv) else None


def wait_ready(cfg: RegistryConfig, pid: int, timeout_s: float) -> float:
    """Wait until ``GET /subjects`` answers 200; return the seconds waited.

    Fails fast when the process exits meanwhile.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        if not pid_alive(pid):
            raise LauncherError(f"the registry (pid {pid}) exited during startup", f"see {cfg.log_file}")
        if registry_answers(cfg.local_url):
            return time.monotonic() - started
        if time.monotonic() >= deadline:
            raise LauncherError(
                f"the registry (pid {pid}) did not answer at {cfg.url} within {timeout_s:.0f} s",
                f"raise --timeout-s, or see {cfg.log_file}",
            )
        time.sleep(0.1)


def up(cfg: RegistryConfig, binary_factory: Callable[[], Path], timeout_s: float, say: Say = print) -> str:
    """Start the registry unless the one named by the pid file already answers; restore the data dir's
    snapshot into a fresh one; return the URL."""
    pid = running_registry(cfg)
    if pid is not None and registry_answers(cfg.local_url):
        say(f"Registry already running (pid {pid}); nothing to do.")
        return cfg.url
    if pid is None:
        cfg.pid_file.unlink(missing_ok=True)
        if port_in_use(cfg.host, cfg.port):
            raise LauncherError(
                f"port {cfg.host}:{cfg.port} is already in use", "stop whatever listens there or pick --port"
            )
        binary = binary_factory()
        pid = start(cfg, binary)
        say(f"Started registry pid {pid}; waiting for it to answer at {cfg.url} (log: {cfg.log_file})")
    try:
        waited = wait_ready(cfg, pid, timeout_s)
        say(f"Registry ready after {waited:.1f} s.")
        if cfg.snapshot_file.is_file():
            restored = import_snapshot(cfg.local_url, json.loads(cfg.snapshot_file.read_text()))
            say(f"Restored {restored} subject versions from {cfg.snapshot_file} (same schema ids).")
    except (LauncherError, RegistryHttpError, OSError) as exc:
        if pid_alive(pid):  # do not leave a half-started registry behind
            stop(cfg, timeout_s=10.0, say=say, save=False)
        else:
            cfg.pid_file.unlink(missing_ok=True)
        if isinstance(exc, LauncherError):
            raise
        raise LauncherError(f"restoring {cfg.snapshot_file} failed: {exc}", "see the registry log") from None
    return cfg.url


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def stop(
    cfg: RegistryConfig, timeout_s: float = 10.0, say: Say = print, save: bool = True, kill: bool = False
) -> bool:
    """Save the schemas (``save``), then stop the registry named by the pid file: SIGTERM, SIGKILL after
    ``timeout_s`` (``kill``: SIGKILL at once, an abrupt stop). Only a ``rivven-schema serve`` process is
    signalled; False when another process holds the pid. A registry that does not answer is stopped without
    saving (the last snapshot stays)."""
    pid = read_pid(cfg.pid_file)
    if pid is None:
        say(f"No pid file at {cfg.pid_file}: no registry to stop.")
        return True
    if not pid_alive(pid):
        say(f"Registry pid {pid} is not running; removing the stale pid file {cfg.pid_file}.")
        cfg.pid_file.unlink(missing_ok=True)
        return True
    argv = process_command_line(pid)
    if argv is None or not is_registry(argv):
        shown = "unreadable" if argv is None else " ".join(argv)[:120]
        say(f"Pid {pid} is not a registry ({shown}); not signalling it. Removing the stale pid file.")
        cfg.pid_file.unlink(missing_ok=True)
        return False
    if save:
        try:
            saved = save_snapshot(cfg)
            say(f"Saved {saved} subject versions to {cfg.snapshot_file}.")
        except (OSError, RegistryHttpError, ValueError) as exc:
            say(f"Could not save the schemas ({exc}); the last snapshot stays.")
    started = time.monotonic()
    os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
    if not _wait_gone(pid, 10.0 if kill else timeout_s):
        say(f"Registry pid {pid} still running after {timeout_s:.0f} s; sending SIGKILL.")
        os.kill(pid, signal.SIGKILL)
        if not _wait_gone(pid, 10.0):
            raise LauncherError(f"registry pid {pid} survived SIGKILL", "check the process by hand")
    cfg.pid_file.unlink(missing_ok=True)
    say(f"Registry stopped ({time.monotonic() - started:.1f} s).")
    return True


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launcher.py", description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("up", "start the registry (no-op when running); restores the data dir's schemas"),
        ("down", "save the schemas into the data dir and stop the registry"),
        ("status", "running or not, and the URL"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--port", type=int, default=8081, help="HTTP port, default 8081")
        p.add_argument("--data-dir", type=Path, default=None, help="default <repo>/var/registry-<port>")
        p.add_argument("--pid-file", type=Path, default=None, help="default <data-dir>/registry.pid")
        if name == "up":
            p.add_argument("--log-file", type=Path, default=None, help="default <data-dir>/registry.log")
            p.add_argument("--timeout-s", type=float, default=30.0, help="seconds to wait for the registry")
            p.add_argument(
                "--cache-dir",
                type=Path,
                default=None,
                help=f"build cache, default $SENTIMENT_REGISTRY_CACHE or "
                f"~/.cache/sentiment-worker/{CRATE}-{CRATE_VERSION}",
            )
        if name == "down":
            p.add_argument(
                "--timeout-s", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL"
            )
            p.add_argument("--no-save", action="store_true", help="stop without saving the schemas")
            p.add_argument(
                "--kill", action="store_true", help="SIGKILL at once (after saving): an abrupt stop"
            )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    say: Say = lambda msg: print(msg, flush=True)  # noqa: E731
    cfg = make_config(args.port, args.data_dir, args.pid_file, getattr(args, "log_file", None))
    try:
        if args.command == "up":
            cache_dir = args.cache_dir.resolve() if args.cache_dir else default_cache_dir(os.environ)
            try:
                url = up(cfg, lambda: ensure_binary(cache_dir, os.environ, say), args.timeout_s, say)
            except LauncherError:
                log_tail = tail(cfg.log_file, LOG_TAIL_LINES)
                if log_tail:
                    print(
                        f"--- last {LOG_TAIL_LINES} lines of {cfg.log_file} ---\n{log_tail}\n---",
                        file=sys.stderr,
                    )
                raise
            print(url, flush=True)
            return 0
        if args.command == "down":
            return 0 if stop(cfg, args.timeout_s, say, save=not args.no_save, kill=args.kill) else 1
        pid = running_registry(cfg)
        if pid is None:
            print(f"not running ({cfg.url}, pid file {cfg.pid_file})")
            return EXIT_NOT_RUNNING
        answers = "answers" if registry_answers(cfg.local_url) else "NOT answering yet"
        print(f"running pid {pid} at {cfg.url} ({answers})")
        return 0
    except LauncherError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
