"""What the local launchers share (deploy/kafka/launcher.py, deploy/registry/launcher.py): a Maven fetch into
a cache directory, a detached java process behind a pid file, and stopping it only when it is ours.

Stdlib only. The launchers are run as scripts (``python deploy/kafka/launcher.py``) or loaded by path
(tests), not as a package: each puts this file's folder on ``sys.path`` and imports it as ``launch_common``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

MARKER_NAME = ".complete"
LOG_TAIL_LINES = 40
EXIT_NOT_RUNNING = 3  # LSB status code for "program is not running"

Say = Callable[[str], None]


class LauncherError(Exception):
    """A launcher step failed; ``hint`` says what to try next."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


# --------------------------------------------------------------------------- Maven fetch


def cache_dir_of(env: Mapping[str, str], variable: str, name: str) -> Path:
    """``$variable`` if set, else ``~/.cache/sentiment-worker/<name>``."""
    override = env.get(variable)
    if override:
        return Path(override).expanduser().resolve()
    return Path.home() / ".cache" / "sentiment-worker" / name


def pom_digest(pom: Path) -> str:
    """The marker content: a copy made from another pom is not reused."""
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def marker_matches(cache_dir: Path, pom: Path) -> bool:
    """``cache_dir`` holds the marker written after a complete Maven fetch for this very ``pom``."""
    marker = cache_dir / MARKER_NAME
    return marker.is_file() and marker.read_text().strip() == pom_digest(pom)


def maven_command(pom: Path, goal: str, *properties: str, missing_hint: str) -> list[str]:
    """``mvn -q -B -f <pom> <goal> -D<property>...``; a LauncherError with `missing_hint` without Maven."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LauncherError("`mvn` is not on PATH", missing_hint)
    return [mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(pom), goal, *(f"-D{p}" for p in properties)]


def run_maven(command: list[str], log_path: Path, say: Say = print, progress_every_s: float = 15.0) -> int:
    """Runs a Maven `command` with its output in `log_path`, saying every `progress_every_s` that it still
    works (a first download takes a while); returns its exit code."""
    started = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        while True:
            try:
                return proc.wait(timeout=progress_every_s)
            except subprocess.TimeoutExpired:
                say(f"  ... Maven still working ({time.monotonic() - started:.0f} s)")


def fetch_into_place(
    cache_dir: Path,
    target: str,
    pom: Path,
    command: Callable[[Path], list[str]],
    *,
    complete: Callable[[Path], bool],
    failure: Callable[[int, str, Path], LauncherError],
    say: Say = print,
    progress_every_s: float = 15.0,
) -> Path:
    """Runs Maven's `command(scratch)` into a scratch directory renamed to ``cache_dir/target``, then writes
    the marker, so an interrupted download is never mistaken for a complete one; returns that directory.
    `complete(scratch)` says whether Maven delivered; if not, `failure(exit code, log tail, log path)`."""
    done = cache_dir / target
    cache_dir.mkdir(parents=True, exist_ok=True)
    scratch = cache_dir / f"{target}.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    mvn_log = cache_dir / "mvn.log"
    rc = run_maven(command(scratch), mvn_log, say, progress_every_s)
    if rc != 0 or not complete(scratch):
        raise failure(rc, tail(mvn_log, LOG_TAIL_LINES), mvn_log)
    shutil.rmtree(done, ignore_errors=True)
    scratch.rename(done)
    (cache_dir / MARKER_NAME).write_text(pom_digest(pom) + "\n")
    return done


# --------------------------------------------------------------------------- processes


def start_detached(
    command: list[str], *, log_file: Path, pid_file: Path, env: Mapping[str, str], cwd: Path, what: str
) -> int:
    """Starts `command` detached (own session, output appended to `log_file`), writes its pid file; returns
    the pid."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"\n===== launcher: starting {what} at {stamp} =====\n".encode())
        log.flush()
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,  # survives the launcher and the terminal's Ctrl-C
        )
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


def port_in_use(host: str, port: int) -> bool:
    """True when something accepts TCP connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def wait_answering(
    what: str,
    pid: int,
    address: tuple[str, int],
    answers: Callable[[float], bool],
    where: str,
    log_file: Path,
    timeout_s: float,
) -> float:
    """Wait until the `what` started as `pid` listens on `address` and `answers(timeout_s)`; return the
    seconds waited. Fails fast when the process exits meanwhile, and after `timeout_s` (naming `where`)."""
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        if not pid_alive(pid):
            raise LauncherError(f"the {what} (pid {pid}) exited during startup", f"see {log_file}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LauncherError(
                f"the {what} (pid {pid}) did not answer at {where} within {timeout_s:.0f} s",
                f"raise --timeout-s, or see {log_file}",
            )
        if port_in_use(*address) and answers(min(5.0, remaining)):
            return time.monotonic() - started
        time.sleep(0.25)


def wait_or_clean_up(
    pid: int, pid_file: Path, wait: Callable[[], float], stop: Callable[[], object]
) -> float:
    """`wait()` for the process just started (or found) as `pid`; when that fails, stop it if it still runs
    (no half-started server left behind), else forget its pid file, and re-raise."""
    try:
        return wait()
    except LauncherError:
        if pid_alive(pid):
            stop()
        else:
            pid_file.unlink(missing_ok=True)
        raise


def read_pid(pid_file: Path) -> int | None:
    """The pid in ``pid_file``, or None when there is no (valid) pid file."""
    try:
        return int(pid_file.read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """True when ``pid`` is a live (non-zombie) process; reaps it when it is our own exited child."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # not our child: the usual case for the CLI
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"  # an exited child nobody reaped yet
    except (OSError, IndexError):
        return True


def process_command_line(pid: int) -> list[str] | None:
    """The argv of ``pid`` (from /proc, else ``ps``), or None when it cannot be read."""
    if Path("/proc/self/cmdline").exists():
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return [part.decode(errors="replace") for part in raw.split(b"\0") if part]
    proc = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True)
    return proc.stdout.split() if proc.returncode == 0 and proc.stdout.strip() else None


def running_pid(pid_file: Path, is_ours: Callable[[Sequence[str]], bool]) -> int | None:
    """The pid named by `pid_file` when it is alive and its command line `is_ours`, else None."""
    pid = read_pid(pid_file)
    if pid is None or not pid_alive(pid):
        return None
    argv = process_command_line(pid)
    return pid if argv is not None and is_ours(argv) else None


def wait_gone(pid: int, timeout_s: float) -> bool:
    """True once `pid` is gone, False if it still runs after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def stop_process(
    pid_file: Path,
    is_ours: Callable[[Sequence[str]], bool],
    what: str,
    *,
    timeout_s: float = 30.0,
    say: Say = print,
    kill: bool = False,
) -> bool:
    """Stops the `what` ("broker", "registry") named by `pid_file`: SIGTERM, SIGKILL after `timeout_s`
    (`kill`: SIGKILL at once, an abrupt stop). Only a process whose command line `is_ours` is signalled:
    False when another process holds the pid (nothing is signalled); the pid file is removed whenever it
    is stale."""
    pid = read_pid(pid_file)
    if pid is None:
        say(f"No pid file at {pid_file}: no {what} to stop.")
        return True
    if not pid_alive(pid):
        say(f"{what.capitalize()} pid {pid} is not running; removing the stale pid file {pid_file}.")
        pid_file.unlink(missing_ok=True)
        return True
    argv = process_command_line(pid)
    if argv is None:
        say(f"Cannot read the command line of pid {pid}; not signalling it.")
        return False
    if not is_ours(argv):
        say(
            f"Pid {pid} is not the {what} ({' '.join(argv)[:120]}); not signalling it. "
            f"Removing the stale pid file {pid_file}."
        )
        pid_file.unlink(missing_ok=True)
        return False
    say(f"Stopping {what} pid {pid} ({'SIGKILL' if kill else 'SIGTERM'})...")
    started = time.monotonic()
    os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)  # SIGTERM: a controlled shutdown
    if not wait_gone(pid, 10.0 if kill else timeout_s):
        say(f"{what.capitalize()} pid {pid} still running after {timeout_s:.0f} s; sending SIGKILL.")
        os.kill(pid, signal.SIGKILL)
        if not wait_gone(pid, 10.0):
            raise LauncherError(f"{what} pid {pid} survived SIGKILL", "check the process by hand")
    pid_file.unlink(missing_ok=True)
    say(f"{what.capitalize()} stopped ({time.monotonic() - started:.1f} s).")
    return True


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a text file ('' when missing)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def report_failure(exc: LauncherError, log_file: Path | None = None) -> int:
    """Prints the tail of `log_file` (a failed start's), then the failed step and its hint, to stderr;
    returns the exit code 1."""
    log_tail = tail(log_file, LOG_TAIL_LINES) if log_file is not None else ""
    if log_tail:
        print(f"--- last {LOG_TAIL_LINES} lines of {log_file} ---\n{log_tail}\n---", file=sys.stderr)
    print(f"error: {exc}", file=sys.stderr)
    if exc.hint:
        print(f"hint: {exc.hint}", file=sys.stderr)
    return 1


def print_started(start: Callable[[], str], log_file: Path) -> int:
    """The `up` command: ``start`` the service and print the address it returns; exit code 0, or 1 after
    `report_failure` (with the tail of ``log_file``) when the start failed."""
    try:
        address = start()
    except LauncherError as exc:
        return report_failure(exc, log_file)
    print(address, flush=True)
    return 0


def print_status(pid: int | None, address: str, pid_file: Path, answers: Callable[[], bool]) -> int:
    """The `status` command: whether the service of ``pid`` (None: none runs) is running at ``address`` and
    ``answers``; exit code 0 when running, `EXIT_NOT_RUNNING` when not."""
    if pid is None:
        print(f"not running ({address}, pid file {pid_file})")
        return EXIT_NOT_RUNNING
    state = "answers" if answers() else "NOT answering yet"
    print(f"running pid {pid} at {address} ({state})")
    return 0
