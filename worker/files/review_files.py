"""Review files, read one way for `produce` and `predict`: TXT (a review per line), CSV (a header row, then a
review per row) and JSONL (a JSON object per line), the text and id taken from the columns or fields
named.

Every data row becomes a `FileReview` or a `BadRow` (its line, kind and reason): a row is bad by the rules
the worker decodes a message with (`schemas.review_decode`, whose text rule is
`schemas.review_input.text_problem`: no visible character is `empty_text`, too many characters
`text_too_long`), plus what only a file can get wrong (a CSV row with the wrong number of fields is
`invalid_csv`, a byte that is not in the file's encoding `invalid_utf8`). A blank line or row is
`empty_text` in every format. What makes the whole file unreadable (it cannot be opened, is in no encoding
it can tell, a CSV header without the text column, broken CSV quoting) raises FeedFileError.

Encodings: as teams export them. `auto` tries UTF-8 (a BOM dropped), then GB18030 (which reads GBK and
GB2312: Excel's CSV export on a Chinese Windows), on the file's first `_SNIFF_BYTES`; `--encoding` names
one. Rows reach the worker as UTF-8 whatever the file's encoding.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from collections.abc import Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final, Literal

from schemas.dead_letter import DeadLetterKind
from schemas.review_decode import decode_review
from schemas.review_input import Review, has_visible_character, text_problem
from worker.errors import ConfigurationError

FileFormat = Literal["auto", "jsonl", "csv", "txt"]

_SUFFIX_FORMATS: Final[dict[str, Literal["jsonl", "csv", "txt"]]] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".txt": "txt",
}
_BOM: Final = b"\xef\xbb\xbf"
_SNIFF_BYTES: Final = 1 << 20  # how much of a file `auto` decodes to tell its encoding
ENCODING_CHOICES: Final = (
    "auto (UTF-8, UTF-8 with BOM, then GB18030/GBK), utf-8, gb18030, or any Python codec"
)
_NO_ID: Final = "\x00no id\x00"  # decode's default id, to tell "no id field" from any id a file can hold
INVALID_CSV: Final = "invalid_csv"
"""The kind of a CSV row with more or fewer fields than the header (the others are `DeadLetterKind`s)."""


class FeedFileError(ConfigurationError, ValueError):
    """A review file cannot be read at all, or holds bad rows; `line` is 1-based (None: the whole file)."""

    def __init__(self, path: Path | str, line: int | None, problem: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.line = line


@dataclass(frozen=True, slots=True)
class FileReview:
    """A good row: its 1-based line, its id (None: the row has none), text, the other fields (CSV cells as
    strings, JSON values as decoded) and the line's bytes (JSONL, TXT: what may be sent verbatim)."""

    line: int
    id: str | None
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    raw: bytes = b""


@dataclass(frozen=True, slots=True)
class BadRow:
    """A row that is not labelled: its line, its id when it has one, the kind (a dead-letter kind, or
    `invalid_csv`) and what is wrong, in words."""

    line: int
    kind: str
    reason: str
    id: str | None = None

    def __str__(self) -> str:
        return f"line {self.line}: {self.kind}: {self.reason}"


Row = FileReview | BadRow


def detect_format(path: Path) -> Literal["jsonl", "csv", "txt"]:
    """The file format from the suffix (.jsonl/.ndjson/.json, .csv, .txt); FeedFileError otherwise."""
    found = _SUFFIX_FORMATS.get(path.suffix.lower())
    if found is None:
        raise FeedFileError(
            path, None, "cannot tell the format from the file name; use .jsonl, .csv or .txt or give --format"
        )
    return found


class ReviewFile:
    """The rows of a review file (or of a binary stream, e.g. stdin: TXT unless told), read lazily, in order,
    each time it is iterated.

    `text_field` / `id_field`: the CSV column or JSON field holding the text and the id (None: `text` and
    `id`, which may be absent); a CSV without the text column, or without an id column named, is a
    FeedFileError; a TXT file has no columns to name. Without an id column or field a row's id is None.
    Limits as the worker's settings: characters per text, bytes per JSON line, JSON nesting. A UTF-8 BOM
    is ignored.
    `bytes_read`: how far reading has got (for a progress bar).
    """

    def __init__(
        self,
        path: Path | None,
        fmt: FileFormat = "auto",
        *,
        stream: BinaryIO | None = None,
        text_field: str | None = None,
        id_field: str | None = None,
        max_text_chars: int = 10_000,
        max_value_bytes: int = 1_048_576,
        max_json_depth: int = 32,
        encoding: str = "auto",
        rename: Mapping[str, str] | None = None,
    ) -> None:
        if (path is None) == (stream is None):
            raise ValueError("give a path or a stream")
        if fmt not in ("auto", "jsonl", "csv", "txt"):
            raise FeedFileError(
                path or "<stdin>", None, f"unknown format {fmt!r}; use auto, jsonl, csv or txt"
            )
        self.path = path
        self.name = str(path) if path is not None else "<stdin>"
        self.format: Literal["jsonl", "csv", "txt"] = (
            fmt if fmt != "auto" else detect_format(path) if path is not None else "txt"
        )
        if self.format == "txt" and (text_field is not None or id_field is not None):
            raise FeedFileError(
                self.name, None, "a TXT file holds one review per line, no columns: --text-field and "
                "--id-field name the columns of a CSV file or the fields of a JSONL one",
            )  # fmt: skip
        self._stream = stream
        self.text_field = text_field or "text"
        self.id_field = id_field or "id"
        self.require_id = id_field is not None
        self.max_text_chars = max_text_chars
        self._max_value_bytes, self._max_json_depth = max_value_bytes, max_json_depth
        self._handle: BinaryIO | None = None
        self._renames = rename  # None: the command has no --map
        self.rename = dict(rename or {})
        """CSV: column → the name it is read under (`produce --map COLUMN=FIELD`)."""
        if self.rename and self.format != "csv":
            raise FeedFileError(self.name, None, "--map renames the columns of a CSV file")
        self._asked_encoding = encoding.strip().lower() or "auto"
        if self._asked_encoding != "auto":
            self._asked_encoding = _known_codec(self.name, self._asked_encoding)
        self.encoding = "utf-8" if self._asked_encoding == "auto" else self._asked_encoding
        """The encoding the rows are read in (`auto`: known once iteration has started)."""
        self.id_counts: dict[str, int] = {}
        """How often each id occurred in the last iteration (`duplicate_ids()` names those seen twice)."""

    @property
    def total_bytes(self) -> int:
        """The file's size (0 for a stream)."""
        return self.path.stat().st_size if self.path is not None else 0

    @property
    def bytes_read(self) -> int:
        """Bytes read so far (0 for a stream)."""
        handle = self._handle
        if handle is None or self.path is None:
            return 0
        return self.total_bytes if handle.closed else handle.tell()

    def __iter__(self) -> Iterator[Row]:
        handle = self._open()
        self._handle = handle
        self.id_counts = {}
        rows: Generator[Row, None, None] | None = None
        try:
            if self._asked_encoding == "auto" and self.path is not None:
                self.encoding = self._sniff(handle)
            rows = self._csv_rows(handle) if self.format == "csv" else self._txt_or_jsonl_rows(handle)
            for row in rows:
                if row.id is not None:
                    self.id_counts[row.id] = self.id_counts.get(row.id, 0) + 1
                yield row
        finally:
            if rows is not None:
                rows.close()  # its own finally first, while the handle is open
            if self.path is not None:
                handle.close()

    def duplicate_ids(self) -> dict[str, int]:
        """The ids the last iteration met more than once, with how often, in file order."""
        return {row_id: count for row_id, count in self.id_counts.items() if count > 1}

    def duplicate_warning(self, examples: int = 3) -> str | None:
        """`warning: 2 ids occur more than once (R1 ×2, R7 ×3): ...` (None: every id once)."""
        found = self.duplicate_ids()
        if not found:
            return None
        shown = ", ".join(f"{row_id} ×{count}" for row_id, count in list(found.items())[:examples])
        more = ", ..." if len(found) > examples else ""
        rows = sum(found.values()) - len(found)
        return (
            f"warning: {self.name}: {len(found)} id(s) occur more than once ({shown}{more}); the {rows} "
            "repeated row(s) are kept, so their results share an id"
        )

    def _sniff(self, handle: BinaryIO) -> str:
        """UTF-8 when the file's first `_SNIFF_BYTES` are UTF-8, or mostly (more valid non-ASCII characters
        than bad bytes: a UTF-8 file with an odd bad row, which then is a bad row naming --encoding); else
        GB18030 when that decodes them (GBK text is hardly ever valid UTF-8, while UTF-8 Chinese often
        decodes as GB18030, hence the order); else UTF-8, whose bad rows name --encoding."""
        head = handle.read(_SNIFF_BYTES)
        handle.seek(0)
        final = len(head) < _SNIFF_BYTES  # else a character cut at the end is no error
        text = codecs.getincrementaldecoder("utf-8")("replace").decode(head, final=final)
        bad = text.count("\ufffd")
        if bad == 0 or sum(1 for char in text if char > "\x7f") - bad > bad:
            return "utf-8"
        try:
            codecs.getincrementaldecoder("gb18030")().decode(head, final=final)
        except UnicodeDecodeError:
            return "utf-8"
        return "gb18030"

    def _txt_or_jsonl_rows(self, handle: BinaryIO) -> Generator[Row, None, None]:
        for number, raw in _lines(handle):
            if self.encoding != "utf-8":
                try:
                    raw = raw.decode(self.encoding).encode("utf-8")
                except UnicodeDecodeError as exc:
                    yield BadRow(
                        number,
                        DeadLetterKind.INVALID_UTF8.value,
                        f"byte {exc.start + 1} (0x{raw[exc.start]:02x}) is not valid {self.encoding}: "
                        f"give the file's encoding with --encoding ({ENCODING_CHOICES})",
                    )
                    continue
            yield self._line_row(number, raw)

    def _open(self) -> BinaryIO:
        if self._stream is not None:
            return self._stream
        assert self.path is not None
        try:
            return self.path.open("rb")
        except OSError as exc:
            raise FeedFileError(self.path, None, f"cannot open: {exc.strerror or exc}") from exc

    # --- TXT and JSONL: a row per line ---

    def _line_row(self, number: int, raw: bytes) -> Row:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return BadRow(
                number,
                DeadLetterKind.INVALID_UTF8.value,
                f"byte {exc.start + 1} (0x{raw[exc.start]:02x}) is not valid UTF-8: give the file's encoding "
                "with --encoding (e.g. gb18030), or save it as UTF-8 (e.g. `iconv -t UTF-8`)",
            )
        if self.format == "txt":
            return self._checked(number, None, text, {}, raw)
        if not has_visible_character(text):
            return BadRow(number, DeadLetterKind.EMPTY_TEXT.value, "the line is blank")
        decoded = decode_review(
            raw,
            input_format="json",
            max_value_bytes=self._max_value_bytes,
            max_text_chars=self.max_text_chars,
            max_json_depth=self._max_json_depth,
            default_id=_NO_ID,
            text_field=self.text_field,
            id_field=self.id_field,
        )
        if isinstance(decoded, Review):
            review_id = None if decoded.id == _NO_ID else decoded.id
            return FileReview(number, review_id, decoded.text, decoded.metadata, raw)
        reason = decoded.reason.replace("value is", "the line is")
        if decoded.kind is DeadLetterKind.MISSING_TEXT:
            reason = (
                f'the object has no "{self.text_field}" field: name the field that holds the review text '
                "with --text-field"
            )
        if number == 1 and text.strip() in ("[", "{"):
            reason += " (the file must hold one JSON object per line: JSON Lines, not pretty-printed JSON)"
        return BadRow(number, decoded.kind.value, reason, self._id_of(text))

    def _id_of(self, line: str) -> str | None:
        """The id of a bad JSON line, when it parses and has a string or integer one (for predict's row)."""
        try:
            document = json.loads(line)
        except (ValueError, RecursionError):
            return None
        found = document.get(self.id_field) if isinstance(document, dict) else None
        if isinstance(found, bool) or not isinstance(found, (str, int)):
            return None
        return str(found)

    def _checked(
        self, number: int, review_id: str | None, text: str, metadata: dict[str, Any], raw: bytes
    ) -> Row:
        problem = text_problem(text, self.max_text_chars)
        if problem is None:
            return FileReview(number, review_id, text, metadata, raw)
        if problem.kind is DeadLetterKind.TEXT_TOO_LONG:
            fix = "split it into several reviews (or raise SENTIMENT_MAX_TEXT_CHARS)"
            return BadRow(number, problem.kind.value, f"{problem.reason}: {fix}", review_id)
        where = "the line" if self.format == "txt" else f"the `{self.text_field}` column"
        if not text.strip():
            reason = f"{where} is empty" if not text else f"{where} holds only whitespace"
        else:
            reason = problem.reason
        return BadRow(number, problem.kind.value, reason, review_id)

    # --- CSV: a header row, then a row per record (a quoted field may span lines) ---

    def _csv_rows(self, handle: BinaryIO) -> Generator[Row, None, None]:
        # utf-8-sig drops a BOM; surrogateescape keeps a bad byte for its row to report; newline="" lets the
        # csv module handle quoted line breaks.
        encoding = "utf-8-sig" if self.encoding == "utf-8" else self.encoding
        text = io.TextIOWrapper(handle, encoding=encoding, errors="surrogateescape", newline="")
        reader = csv.reader(text)
        try:
            header = next(reader, None)
            if header is None:
                raise FeedFileError(
                    self.name, 1, f"empty file; a header row with a `{self.text_field}` column is required"
                )
            header = [name.strip() for name in header]
            unknown = [name for name in self.rename if name not in header]
            if unknown:
                raise FeedFileError(
                    self.name, 1, f"--map names no column {', '.join(unknown)} (found: {', '.join(header)})"
                )
            header = [self.rename.get(name, name) for name in header]
            self._check_header(header)
            text_at = header.index(self.text_field)
            id_at = header.index(self.id_field) if self.id_field in header else None
            start = reader.line_num + 1
            for cells in reader:
                line, start = start, reader.line_num + 1
                yield self._csv_row(line, header, cells, text_at, id_at)
        except csv.Error as exc:
            raise FeedFileError(self.name, reader.line_num, f"malformed CSV: {exc}") from exc
        finally:
            text.detach()

    def _rename_hint(self, field: str) -> str:
        if self._renames is None:
            return ""
        return f", or read a column as `{field}` with --map COLUMN={field}"

    def _check_header(self, header: list[str]) -> None:
        if any(_undecoded(name) for name in header):
            raise FeedFileError(
                self.name, 1, f"the header row is not valid {self.encoding} text: give the file's encoding "
                f"with --encoding ({ENCODING_CHOICES})",
            )  # fmt: skip
        found = ", ".join(header) or "nothing"
        if self.text_field not in header:
            raise FeedFileError(
                self.name, 1, f"the header row has no `{self.text_field}` column (found: {found}): name the "
                "column that holds the review text with --text-field" + self._rename_hint(self.text_field),
            )  # fmt: skip
        if self.require_id and self.id_field not in header:
            raise FeedFileError(
                self.name,
                1,
                f"the header row has no `{self.id_field}` column (found: {found})"
                + self._rename_hint(self.id_field),
            )
        if any(not name for name in header):
            raise FeedFileError(self.name, 1, "the header row has an empty column name")
        duplicates = sorted({name for name in header if header.count(name) > 1})
        if duplicates:
            raise FeedFileError(
                self.name, 1, f"duplicate column names in the header: {', '.join(duplicates)}"
            )

    def _csv_row(
        self, line: int, header: list[str], cells: list[str], text_at: int, id_at: int | None
    ) -> Row:
        if not any(cell.strip() for cell in cells):
            return BadRow(line, DeadLetterKind.EMPTY_TEXT.value, "the row is blank")
        review_id = (cells[id_at] or None) if id_at is not None and id_at < len(cells) else None
        if len(cells) != len(header):
            reason = f"{len(cells)} fields but the header has {len(header)}: quote fields that contain commas"
            return BadRow(line, INVALID_CSV, reason, review_id)
        try:
            "".join(cells).encode("utf-8")
        except UnicodeEncodeError:
            reason = (
                f"holds bytes that are not valid {self.encoding}: give the file's encoding with --encoding "
                f"({ENCODING_CHOICES})"
            )
            return BadRow(line, DeadLetterKind.INVALID_UTF8.value, reason, review_id)
        metadata = {
            name: cell
            for at, (name, cell) in enumerate(zip(header, cells, strict=True))
            if at not in (text_at, id_at)
        }
        return self._checked(line, review_id, cells[text_at], metadata, b"")


def _undecoded(text: str) -> bool:
    """True when `text` holds a byte its encoding could not decode (kept as a lone surrogate)."""
    return any("\udc80" <= char <= "\udcff" for char in text)


def _known_codec(name: str, encoding: str) -> str:
    try:
        return codecs.lookup(encoding).name
    except LookupError:
        raise FeedFileError(name, None, f"unknown encoding {encoding!r}: use {ENCODING_CHOICES}") from None


def _lines(handle: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, bytes without line ending) of every line; a leading BOM dropped."""
    for number, raw in enumerate(handle, start=1):
        raw = raw.rstrip(b"\r\n")
        if number == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM) :]
        yield number, raw


def text_lines(lines: Iterable[str], max_text_chars: int = 10_000) -> Iterator[Row]:
    """The rows of text lines, lazily, as those of a TXT file (undecodable bytes as surrogate escapes)."""
    reader = ReviewFile(None, "txt", stream=io.BytesIO(), max_text_chars=max_text_chars)
    for number, line in enumerate(lines, start=1):
        raw = line.encode("utf-8", "surrogateescape").rstrip(b"\r\n")
        yield reader._line_row(number, raw[len(_BOM) :] if number == 1 and raw.startswith(_BOM) else raw)
