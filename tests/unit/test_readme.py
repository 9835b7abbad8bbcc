"""The README is a user guide that stays true: at most 300 lines; the quick start's two commands; every
command of the CLI in its table, and every command, flag and choice shown in the README and docs/ accepted
by the parser; every `make` target named exists; every `SENTIMENT_*` name is a setting (each setting has its
row in docs/settings.md, see test_settings_doc.py); one models table between its markers; every relative
link resolves; every file in benchmarks/results/ states date, CPU, command and a table."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.cli.main import build_parser
from worker.config import OTHER_ENVIRONMENT, WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SETTINGS_DOC = ROOT / "docs" / "settings.md"
RESULTS = ROOT / "benchmarks" / "results"
MAX_README_LINES = 300
# Environment variables that are read outside WorkerSettings, on purpose.
OTHER_ENV_VARS = set(OTHER_ENVIRONMENT)


def user_docs() -> list[Path]:
    """The Markdown a user reads: README, docs/, benchmarks/ (the model card is the model's own)."""
    return [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").rglob("*.md"))]


def readme() -> str:
    return README.read_text(encoding="utf-8")


def section(text: str, title: str) -> str:
    """The body of a `## title` section, up to the next `## `."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def tables(text: str) -> list[list[str]]:
    """Markdown tables as lists of their lines (outside fenced code)."""
    found: list[list[str]] = []
    current: list[str] = []
    for line in re.sub(r"^```.*?^```", "", text, flags=re.S | re.M).splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append(current)
            current = []
    return [*found, current] if current else found


# commands

PARSER = build_parser()


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps sub-commands only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


COMMANDS = _subcommands(PARSER)


def check_invocation(words: list[str]) -> list[str]:
    """Problems with `sentiment-worker <words>` as the docs show it (placeholders like DIR are fine)."""
    if not words or words[0] not in COMMANDS:
        return [f"unknown command {words[:1]}"]
    parser, problems = COMMANDS[words[0]], []
    tokens = [token.strip("[]()…,;`") for token in words[1:]]  # a backtick ends an inline command
    for i, token in enumerate(tokens):
        if token in _subcommands(parser):
            parser = _subcommands(parser)[token]
        elif token.startswith("--"):
            action = parser._option_string_actions.get(token.split("=")[0])
            if action is None:
                problems.append(f"{words[0]}: no option {token}")
                continue
            value = tokens[i + 1] if i + 1 < len(tokens) else ""
            if action.choices is not None and re.fullmatch(r"[a-z][a-z0-9_\\|-]*", value):
                wrong = [v for v in value.replace("\\|", "|").split("|") if v not in action.choices]
                problems.extend(
                    f"{words[0]} {token}: {v!r} is not one of {list(action.choices)}" for v in wrong
                )
    return problems


def invocations(text: str) -> Iterator[list[str]]:
    """The words after each `sentiment-worker` in code (fenced blocks and inline spans), to the end of the
    command (a comment, a pipe, `&&`, the end of the span or line; backslash continuations joined)."""
    code = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    inline = re.findall(r"`([^`\n]*(?:\n[^`\n]+)*)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
    for chunk in [*code, *inline]:
        for line in chunk.replace("\\\n", " ").splitlines():
            for match in re.finditer(r"sentiment-worker ([a-z][a-z0-9-]*(?: [^#|&]*)?)", line):
                yield match.group(1).split()


def test_the_commands_table_lists_every_command_the_cli_has() -> None:
    (table,) = tables(section(readme(), "Commands"))
    listed = {span.split()[0] for row in table[2:] for span in re.findall(r"`([^`]+)`", row.split(" | ")[0])}
    assert listed == set(COMMANDS), (
        f"missing: {set(COMMANDS) - listed}; not commands: {listed - set(COMMANDS)}"
    )


def test_every_command_row_parses() -> None:
    (table,) = tables(section(readme(), "Commands"))
    problems = [
        problem
        for row in table[2:]
        for span in re.findall(r"`([^`]+)`", row.replace("\\|", "\x00").split(" | ")[0])
        for problem in check_invocation(span.replace("\x00", "\\|").split())
    ]
    assert not problems


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_sentiment_worker_command_shown_is_accepted(path: Path) -> None:
    shown = list(invocations(path.read_text(encoding="utf-8")))
    problems = [f"`sentiment-worker {' '.join(w)}`: {p}" for w in shown for p in check_invocation(w)]
    assert not problems


def test_the_invocation_check_catches_wrong_commands_flags_and_choices() -> None:
    assert check_invocation(["export", "--model", "DIR", "--format", "onnx"]) == []
    assert check_invocation(["topics", "create", "--partitions", "N"]) == []
    assert check_invocation(["quantize", "--method", "ort-dynamic\\|ort-static"]) == []
    assert check_invocation(["exprot"]) and check_invocation(["run", "--max-mesages", "3"])
    assert check_invocation(["export", "--format", "tflite"])


# quick start, make targets


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-z][a-z0-9-]*):", text, re.M))


def test_quick_start_shows_make_demo_and_make_test() -> None:
    quick = section(readme(), "Quick start")
    assert "make demo" in quick and "make test" in quick
    assert {"demo", "test"} <= make_targets()


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_make_target_named_exists(path: Path) -> None:
    named = set(re.findall(r"`make ([a-z][a-z0-9-]*)", path.read_text(encoding="utf-8")))
    assert named <= make_targets(), f"not in the Makefile: {named - make_targets()}"


def test_readme_is_a_guide_of_at_most_300_lines() -> None:
    lines = len(readme().splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines: move detail to docs/ or benchmarks/results/"
    )


# settings, models


def test_every_setting_has_a_row_in_the_settings_reference() -> None:
    text = SETTINGS_DOC.read_text(encoding="utf-8")
    missing = [name for name in WorkerSettings.model_fields if f"| `SENTIMENT_{name.upper()}` |" not in text]
    assert not missing, f"run `make docs`: docs/settings.md lacks {missing}"
    assert "(docs/settings.md)" in section(readme(), "Settings")


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_sentiment_variable_named_is_a_setting(path: Path) -> None:
    settings = {f"SENTIMENT_{name.upper()}" for name in WorkerSettings.model_fields}
    named = set(re.findall(r"SENTIMENT_[A-Z][A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8")))
    assert named <= settings | OTHER_ENV_VARS, f"not settings: {sorted(named - settings - OTHER_ENV_VARS)}"


def test_the_models_section_has_one_table_between_its_markers() -> None:
    models = section(readme(), "Models")
    assert models.count("<!-- models-table:start -->") == 1 and models.count("<!-- models-table:end -->") == 1
    (table,) = tables(models)
    inside = models.split("<!-- models-table:start -->")[1].split("<!-- models-table:end -->")[0]
    assert tables(inside) == [table] and len(table) >= 3
    assert any("models/default" in row for row in table[2:]), "the table names the shipped default"


# links, results


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(
        r"^#+ (.+)$", re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M), re.M
    )
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        missing_anchor = (
            bool(anchor)
            and resolved.suffix == ".md"
            and resolved.exists()
            and anchor not in _anchors(resolved)
        )
        if not resolved.exists() or missing_anchor:
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: broken links {broken}"


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.md")), ids=lambda p: p.name)
def test_every_benchmark_result_states_date_cpu_command_and_a_table(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    date = re.search(r"^- \*\*Date\*\*: (\d{4}-\d{2}-\d{2})", text, re.M)
    assert date and path.name.startswith(date.group(1) + "-"), "file name starts with the run's date"
    assert re.search(r"^- \*\*CPU\*\*: \S", text, re.M) and re.search(r"^- \*\*Command\*\*: \S", text, re.M)
    assert tables(text), "a table of what was measured"


def test_every_benchmark_result_is_listed_in_the_benchmarks_readme() -> None:
    results = {path.name for path in RESULTS.glob("*.md")}
    listed = set(
        re.findall(r"\(results/([^)#]+\.md)\)", (ROOT / "benchmarks" / "README.md").read_text("utf-8"))
    )
    assert results, "benchmarks/results/ holds the recorded runs"
    assert results == listed, (
        f"unlisted: {sorted(results - listed)}; listed, missing: {sorted(listed - results)}"
    )
