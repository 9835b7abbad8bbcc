"""deploy/registry/launcher.py without a registry: distribution cache marker, the server's command and
settings, which processes `down` may signal, errors that say what to install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.registry_fixtures import REGISTRY_LAUNCHER, load_registry_launcher, run_registry_launcher
from worker.bench.worker_process import free_port


@pytest.fixture(scope="module")
def launcher() -> ModuleType:
    return load_registry_launcher()


@pytest.fixture
def cfg(launcher: ModuleType, tmp_path: Path) -> Any:
    return launcher.make_config(port=18081, data_dir=tmp_path / "data")


def test_defaults_put_files_in_the_data_dir_and_the_api_under_ccompat(launcher: ModuleType, cfg: Any) -> None:
    assert cfg.pid_file == cfg.data_dir / "registry.pid"
    assert cfg.log_file == cfg.data_dir / "registry.log"
    assert cfg.url == "http://localhost:18081/apis/ccompat/v7"
    assert cfg.local_url == "http://127.0.0.1:18081/apis/ccompat/v7"


def test_app_ready_needs_the_marker_of_this_pom(launcher: ModuleType, tmp_path: Path) -> None:
    runner = tmp_path / "app" / launcher.RUNNER_JAR
    runner.parent.mkdir()
    runner.write_bytes(b"")
    assert not launcher.app_ready(tmp_path)  # an interrupted download leaves no marker
    (tmp_path / launcher.MARKER_NAME).write_text("digest-of-another-pom\n")
    assert not launcher.app_ready(tmp_path)
    (tmp_path / launcher.MARKER_NAME).write_text(launcher.pom_digest() + "\n")
    assert launcher.app_ready(tmp_path)


def test_schemas_go_to_an_h2_file_in_the_data_dir_written_at_each_commit(
    launcher: ModuleType, cfg: Any
) -> None:
    env = launcher.command_env(cfg, {"PATH": "/usr/bin"})
    assert env["HTTP_PORT"] == "18081"
    assert env["REGISTRY_DATASOURCE_URL"] == f"jdbc:h2:file:{cfg.data_dir / 'h2' / 'registry'};WRITE_DELAY=0"
    assert env["PATH"] == "/usr/bin"


def test_server_listens_on_loopback_only(launcher: ModuleType, cfg: Any, tmp_path: Path) -> None:
    argv = launcher.java_command(cfg, tmp_path / "app")
    assert "-Dquarkus.http.host=127.0.0.1" in argv
    assert argv[-2:] == ["-jar", str(tmp_path / "app" / launcher.RUNNER_JAR)]
    assert launcher.is_registry(argv)


def test_only_an_apicurio_java_process_is_signalled(launcher: ModuleType) -> None:
    assert launcher.is_registry(
        ["/usr/bin/java", "-Xmx512m", "-jar", "/c/app/apicurio-registry-app-2.6.13.Final-runner.jar"]
    )
    assert not launcher.is_registry(["/usr/bin/java", "-cp", "/c/libs/*", "kafka.Kafka", "server.properties"])
    assert not launcher.is_registry(["python", "apicurio-registry-app-2.6.13.Final-runner.jar"])
    assert not launcher.is_registry([])


def test_up_without_maven_or_a_cached_registry_says_what_to_do(tmp_path: Path) -> None:
    env = {"PATH": "/nonexistent", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(REGISTRY_LAUNCHER), "up", "--port", "9", "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 1
    assert "`mvn` is not on PATH" in proc.stderr
    assert "hint: install Maven" in proc.stderr
    assert not (tmp_path / "data" / "registry.pid").exists()


def fake_mvn(bin_dir: Path, script: str) -> None:
    """A `mvn` on PATH that runs ``script`` (bash) with the launcher's arguments."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    mvn = bin_dir / "mvn"
    mvn.write_text(f"#!/usr/bin/env bash\n{script}\n")
    mvn.chmod(0o755)


def test_an_unpacked_distribution_is_kept_and_reused(
    launcher: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the fake writes the runner jar where -DoutputDirectory points, and counts its runs
    fake_mvn(
        tmp_path / "bin",
        'for a in "$@"; do case $a in -DoutputDirectory=*) out=${a#*=};; esac; done\n'
        f'mkdir -p "$out/lib" && touch "$out/{launcher.RUNNER_JAR}" && echo run >> "{tmp_path}/runs"',
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    cache = tmp_path / "cache"
    app = launcher.ensure_app(cache, say=lambda _: None)
    assert app == cache / "app" and (app / launcher.RUNNER_JAR).is_file()
    assert not (cache / "app.partial").exists()
    assert launcher.ensure_app(cache, say=lambda _: None) == app
    assert (tmp_path / "runs").read_text().count("run") == 1


def test_a_failed_download_leaves_no_marker_and_shows_mavens_output(
    launcher: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_mvn(tmp_path / "bin", 'echo "Could not resolve io.apicurio:apicurio-registry-app"; exit 1')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    cache = tmp_path / "cache"
    with pytest.raises(launcher.LauncherError, match="Could not resolve io.apicurio") as failed:
        launcher.ensure_app(cache, say=lambda _: None)
    assert "check Maven Central access" in failed.value.hint
    assert not (cache / launcher.MARKER_NAME).exists() and not (cache / "app").exists()


# A stand-in for the registry's java process: named `java`, with the runner jar among its arguments (so
# `down` recognises it), answering the Confluent API's `GET .../subjects` on the launcher's HTTP_PORT.
FAKE_REGISTRY = """
import http.server, os, sys
class Subjects(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"[]")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["HTTP_PORT"])), Subjects).serve_forever()
"""


def fake_java(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "fake_registry.py").write_text(FAKE_REGISTRY)
    java = bin_dir / "java"
    java.write_text(
        f'#!/usr/bin/env bash\nexec -a "$0" {sys.executable} {bin_dir / "fake_registry.py"} "$@"\n'
    )
    java.chmod(0o755)


def test_down_stops_a_restarted_registry_and_a_flag_it_does_not_know_fails_the_test(
    launcher: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """up, down, up, down on one port and data dir, as test_registry_formats does: each `down` stops the
    registry the last `up` started (pid gone, port free, pid file removed). The `--no-save` that test passed
    (the broker launcher's flag) was refused by argparse unchecked, leaving the restarted registry running
    after `make test`: the suite's launcher calls now fail on such a refusal."""
    fake_java(tmp_path / "bin")
    cache = tmp_path / "cache"
    (cache / "app").mkdir(parents=True)
    (cache / "app" / launcher.RUNNER_JAR).write_bytes(b"")
    (cache / launcher.MARKER_NAME).write_text(launcher.pom_digest() + "\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("SENTIMENT_REGISTRY_CACHE", str(cache))
    port = free_port()
    common = ["--port", str(port), "--data-dir", str(tmp_path / "data")]
    cfg = launcher.make_config(port, tmp_path / "data")
    for _ in range(2):
        up = run_registry_launcher("up", *common, timeout_s=60)
        assert up.returncode == 0, up.stdout + up.stderr
        pid = launcher.running_registry(cfg)
        assert pid is not None and launcher.port_in_use("127.0.0.1", port)
        down = run_registry_launcher("down", *common, timeout_s=60)
        assert down.returncode == 0, down.stdout + down.stderr
        assert not launcher.launch_common.pid_alive(pid) and not launcher.port_in_use("127.0.0.1", port)
        assert not cfg.pid_file.exists()
    with pytest.raises(pytest.fail.Exception, match="unrecognized arguments: --no-save"):
        run_registry_launcher("down", *common, "--no-save", timeout_s=60)
