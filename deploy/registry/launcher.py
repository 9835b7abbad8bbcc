#!/usr/bin/env python3
"""Start, stop and inspect a local Apicurio Registry 2.6.13 (Confluent-compatible API), no Docker.

    python deploy/registry/launcher.py up [--port 8081] [--data-dir DIR]    # prints the URL
    python deploy/registry/launcher.py status [--port 8081]
    python deploy/registry/launcher.py down [--port 8081] [--data-dir DIR] [--kill]

The server is Apicurio Registry's own distribution from Maven Central (deploy/registry/pom.xml, unpacked once
into a cache directory outside the repo); clients use its Confluent Schema Registry API at
``http://localhost:<port>/apis/ccompat/v7``. Schemas live in an H2 database file in the data dir, so they and
their ids survive a restart. Stdlib only; importable, so tests can call the small functions below directly.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# launch_common.py sits in the folder above; this file is run as a script or loaded by path (tests).
if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import launch_common  # noqa: E402
from launch_common import (  # noqa: E402
    LauncherError,
    Say,
    fetch_into_place,
    marker_matches,
    port_in_use,
    print_started,
    print_status,
    report_failure,
    running_pid,
    start_detached,
    stop_process,
    wait_answering,
    wait_or_clean_up,
)

APICURIO_VERSION = "2.6.13.Final"
MARKER_NAME = launch_common.MARKER_NAME  # written once a download is complete
RUNNER_JAR = f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"
CCOMPAT_PATH = "/apis/ccompat/v7"
HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
REPO_ROOT = HERE.parent.parent
DEFAULT_HEAP_OPTS = ("-Xmx512m", "-Xms128m")


@dataclass(frozen=True)
class RegistryConfig:
    """Where one local registry runs; ``port`` is its HTTP port on ``host``."""

    port: int
    data_dir: Path
    pid_file: Path
    log_file: Path
    host: str = "127.0.0.1"
    advertised_host: str = "localhost"
    heap_opts: tuple[str, ...] = DEFAULT_HEAP_OPTS

    @property
    def url(self) -> str:
        """The Confluent-compatible API clients use (``SchemaRegistryClient({"url": ...})``)."""
        return f"http://{self.advertised_host}:{self.port}{CCOMPAT_PATH}"

    @property
    def local_url(self) -> str:
        return f"http://{self.host}:{self.port}{CCOMPAT_PATH}"

    @property
    def database(self) -> Path:
        """The H2 database (``<data-dir>/h2/registry.mv.db`` on disk) holding every schema and setting."""
        return self.data_dir / "h2" / "registry"


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
    """``$SENTIMENT_REGISTRY_CACHE`` or ``~/.cache/sentiment-worker/apicurio-registry-<version>``."""
    return launch_common.cache_dir_of(
        env, "SENTIMENT_REGISTRY_CACHE", f"apicurio-registry-{APICURIO_VERSION}"
    )


# --------------------------------------------------------------------------- distribution


def pom_digest(pom: Path = POM) -> str:
    """The marker content: a copy unpacked from another pom is not reused."""
    return launch_common.pom_digest(pom)


def app_ready(cache_dir: Path, pom: Path = POM) -> bool:
    """True when ``cache_dir/app`` holds a complete unpacked distribution of this pom's release."""
    return marker_matches(cache_dir, pom) and (cache_dir / "app" / RUNNER_JAR).is_file()


def maven_command(pom: Path, output_dir: Path, build_dir: Path) -> list[str]:
    return launch_common.maven_command(
        pom,
        "dependency:unpack",
        f"outputDirectory={output_dir}",
        f"registry.build.dir={build_dir}",
        missing_hint="install Maven (apt-get install maven); the registry comes from Maven Central",
    )


def ensure_app(cache_dir: Path, pom: Path = POM, say: Say = print, progress_every_s: float = 15.0) -> Path:
    """Unpack the registry distribution into ``cache_dir/app`` with Maven unless a complete copy is there;
    return that directory (see `launch_common.fetch_into_place`)."""
    app = cache_dir / "app"
    if app_ready(cache_dir, pom):
        return app
    say(
        f"Fetching Apicurio Registry {APICURIO_VERSION} (142 MB) with Maven into {app} "
        "(a minute or so the first time)..."
    )
    started = time.monotonic()
    fetch_into_place(
        cache_dir,
        "app",
        pom,
        lambda scratch: maven_command(pom, scratch, cache_dir / "maven"),
        complete=lambda scratch: (scratch / RUNNER_JAR).is_file(),
        failure=lambda rc, log_tail, log: LauncherError(
            f"Maven failed (exit {rc}) fetching Apicurio Registry:\n{log_tail}",
            f"check Maven Central access (full log: {log})",
        ),
        say=say,
        progress_every_s=progress_every_s,
    )
    shutil.rmtree(cache_dir / "maven", ignore_errors=True)  # the plugin's unpack markers
    say(
        f"Apicurio Registry ready to start ({len(list((app / 'lib').glob('*.jar')))} jars, "
        f"{time.monotonic() - started:.0f} s)"
    )
    return app


# --------------------------------------------------------------------------- lifecycle


def java_command(cfg: RegistryConfig, app: Path) -> list[str]:
    java = shutil.which("java")
    if java is None:
        raise LauncherError(
            "`java` is not on PATH", "install a JRE 11+ (apt-get install openjdk-17-jre-headless)"
        )
    return [
        java,
        *cfg.heap_opts,
        "-XX:+UseSerialGC",  # one small heap on a small machine
        "-Djava.awt.headless=true",
        f"-Dquarkus.http.host={cfg.host}",
        "-jar",
        str(app / RUNNER_JAR),
    ]


def command_env(cfg: RegistryConfig, base: Mapping[str, str]) -> dict[str, str]:
    """Apicurio's own settings (its application.properties reads these): port and the H2 file database.

    ``WRITE_DELAY=0``: H2 writes each commit to the file at once, so a killed registry loses no schema.
    """
    env = dict(base)
    env["HTTP_PORT"] = str(cfg.port)
    env["REGISTRY_DATASOURCE_URL"] = f"jdbc:h2:file:{cfg.database};WRITE_DELAY=0"
    return env


def start(cfg: RegistryConfig, app: Path) -> int:
    """Start the registry detached (own session, output appended to the log file); return its pid."""
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    cfg.database.parent.mkdir(exist_ok=True)
    return start_detached(
        java_command(cfg, app),
        log_file=cfg.log_file,
        pid_file=cfg.pid_file,
        env=command_env(cfg, os.environ),
        cwd=cfg.data_dir,
        what="registry",
    )


def registry_answers(url: str, timeout_s: float = 2.0) -> bool:
    """True when ``GET <url>/subjects`` answers 200 (the Confluent-compatible API is ready)."""
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.HTTPError):
        return False


def is_registry(argv: Sequence[str]) -> bool:
    """True for a ``java ... -jar .../apicurio-registry-app-*-runner.jar`` command line."""
    return (
        bool(argv)
        and Path(argv[0]).name == "java"
        and any(
            Path(arg).name.startswith("apicurio-registry-app-") and arg.endswith("-runner.jar")
            for arg in argv
        )
    )


def running_registry(cfg: RegistryConfig) -> int | None:
    """The pid of the live registry named by the pid file, if any."""
    return running_pid(cfg.pid_file, is_registry)


def wait_ready(cfg: RegistryConfig, pid: int, timeout_s: float) -> float:
    """Wait until the Confluent-compatible API answers; return the seconds waited.

    Fails fast when the process exits meanwhile.
    """
    return wait_answering(
        "registry",
        pid,
        (cfg.host, cfg.port),
        lambda _timeout_s: registry_answers(cfg.local_url),
        cfg.url,
        cfg.log_file,
        timeout_s,
    )


def up(cfg: RegistryConfig, app_factory: Callable[[], Path], timeout_s: float, say: Say = print) -> str:
    """Start the registry unless the one named by the pid file already answers; return its URL."""
    pid = running_registry(cfg)
    if pid is not None:
        if registry_answers(cfg.local_url):
            say(f"Registry already running (pid {pid}); nothing to do.")
            return cfg.url
        say(f"Registry pid {pid} is running but not answering yet; waiting.")
    else:
        cfg.pid_file.unlink(missing_ok=True)
        if port_in_use(cfg.host, cfg.port):
            raise LauncherError(
                f"port {cfg.host}:{cfg.port} is already in use", "stop whatever listens there or pick --port"
            )
        app = app_factory()
        pid = start(cfg, app)
        say(f"Started registry pid {pid}; waiting for it to answer at {cfg.url} (log: {cfg.log_file})")
    waited = wait_or_clean_up(
        pid, cfg.pid_file, lambda: wait_ready(cfg, pid, timeout_s), lambda: stop(cfg, timeout_s=10.0, say=say)
    )
    say(f"Registry ready after {waited:.1f} s (schemas in {cfg.database}.mv.db).")
    return cfg.url


def stop(cfg: RegistryConfig, timeout_s: float = 30.0, say: Say = print, kill: bool = False) -> bool:
    """Stop the registry named by the pid file: SIGTERM, SIGKILL after ``timeout_s`` (``kill``: SIGKILL at
    once, an abrupt stop). Only an Apicurio Registry java process is signalled (see
    `launch_common.stop_process`)."""
    return stop_process(cfg.pid_file, is_registry, "registry", timeout_s=timeout_s, say=say, kill=kill)


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launcher.py", description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("up", "start the registry (no-op when running)"),
        ("down", "stop the registry (its schemas stay in the data dir)"),
        ("status", "running or not, and the URL"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--port", type=int, default=8081, help="HTTP port, default 8081")
        p.add_argument("--data-dir", type=Path, default=None, help="default <repo>/var/registry-<port>")
        p.add_argument("--pid-file", type=Path, default=None, help="default <data-dir>/registry.pid")
        if name == "up":
            p.add_argument("--log-file", type=Path, default=None, help="default <data-dir>/registry.log")
            p.add_argument("--timeout-s", type=float, default=120.0, help="seconds to wait for the registry")
            p.add_argument(
                "--cache-dir",
                type=Path,
                default=None,
                help="distribution cache, default $SENTIMENT_REGISTRY_CACHE or "
                f"~/.cache/sentiment-worker/apicurio-registry-{APICURIO_VERSION}",
            )
        if name == "down":
            p.add_argument(
                "--timeout-s", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL"
            )
            p.add_argument("--kill", action="store_true", help="SIGKILL at once: an abrupt stop")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    say: Say = lambda msg: print(msg, flush=True)  # noqa: E731
    cfg = make_config(args.port, args.data_dir, args.pid_file, getattr(args, "log_file", None))
    try:
        if args.command == "up":
            cache_dir = args.cache_dir.resolve() if args.cache_dir else default_cache_dir(os.environ)
            return print_started(
                lambda: up(cfg, lambda: ensure_app(cache_dir, say=say), args.timeout_s, say), cfg.log_file
            )
        if args.command == "down":
            return 0 if stop(cfg, args.timeout_s, say, kill=args.kill) else 1
        return print_status(
            running_registry(cfg), cfg.url, cfg.pid_file, lambda: registry_answers(cfg.local_url)
        )
    except LauncherError as exc:
        return report_failure(exc)


if __name__ == "__main__":
    sys.exit(main())
