"""One error base: every error class of the project (found in the source, so a new one cannot hide) derives
from `WorkerError` through exactly one category, and `sentiment-worker` exits with that category's code
(README "Exit codes": 2 cannot start as configured, 1 failed while running, 130 interrupted) after one line
`sentiment-worker <command>: error: <message>`."""

from __future__ import annotations

import ast
import builtins
import importlib
import logging
from pathlib import Path

import pytest

import worker.cli.lag as lag_command
from worker.cli.main import exit_code, main
from worker.errors import ConfigurationError, OperationError, WorkerError

ROOT = Path(__file__).resolve().parents[2]
CATEGORIES = {ConfigurationError: 2, OperationError: 1}

# Each error class of the project and the exit code its category gives (today's codes: a command that
# caught the error exited with the same code). A new error class goes here with its category's code.
EXIT_CODES = {
    "AclError": 1,
    "AuthorizationError": 2,
    "BaseModelError": 1,
    "CalibrationError": 1,
    "CallAbandoned": 1,
    "ConversionError": 1,
    "DataFileError": 2,
    "AdmissionClosed": 1,
    "DeliveryFailedError": 1,
    "DeviceUnavailableError": 2,
    "EngineClosed": 1,
    "ExportError": 2,
    "FeedFileError": 2,
    "HttpServerError": 2,
    "LagError": 1,
    "ModelChangeRefused": 1,
    "ModelLoadError": 2,
    "ModelRefused": 1,
    "OutputWidthError": 1,
    "Overloaded": 1,
    "PortInUseError": 2,
    "PredictRunError": 1,
    "PromotionError": 1,
    "QuantizeError": 2,
    "RegistryUnavailable": 1,
    "ReportError": 2,
    "StartupError": 2,
    "TailError": 1,
    "ThesaurusError": 2,
    "TopicAdminError": 1,
    "TopicMissingError": 2,
    "TrainingError": 2,
    "TransactionsStuckError": 1,
    "TuningError": 1,
    "UnverifiedModelError": 2,
    "VocabularyError": 1,
    "WeightsError": 2,
    "WorkerProcessError": 1,
    "OversizedSchema": 1,
    "RegistryWaitStopped": 1,
    "SchemaRefused": 1,
    "UnknownSchemaId": 1,
    "ValueRefused": 1,
}


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else ast.unparse(node)


def error_classes() -> dict[str, str]:
    """Every exception class defined in worker/ and schemas/ (by its bases, read from the source):
    class name -> module. Private ones (an underscore name never leaves its module) and the categories
    themselves are left out."""
    defined: dict[str, tuple[str, list[str]]] = {}
    for path in sorted(p for package in ("worker", "schemas") for p in (ROOT / package).rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                defined[node.name] = (module, [_base_name(base) for base in node.bases])

    def is_exception(name: str, seen: frozenset[str] = frozenset()) -> bool:
        builtin = getattr(builtins, name, None)
        if isinstance(builtin, type) and issubclass(builtin, BaseException):
            return True
        bases = defined.get(name, ("", []))[1]
        return name not in seen and any(is_exception(base, seen | {name}) for base in bases)

    return {
        name: module
        for name, (module, _) in defined.items()
        if is_exception(name) and not name.startswith("_") and module != "worker.errors"
    }


ERRORS = error_classes()


def test_the_source_walk_finds_the_errors_direct_and_inherited() -> None:
    assert ERRORS["StartupError"] == "worker.inference.token_budget"
    assert ERRORS["AuthorizationError"] == "worker.kafka.authorization"  # derives from StartupError
    assert ERRORS["ConversionError"] == "worker.training.base_model_convert"  # from BaseModelError
    assert "ItemError" not in ERRORS  # a pydantic model of the HTTP API, not an exception


def test_every_error_class_is_listed_with_its_exit_code() -> None:
    unlisted = sorted(set(ERRORS) - set(EXIT_CODES))
    gone = sorted(set(EXIT_CODES) - set(ERRORS))
    assert not unlisted, f"give these a category of worker.errors and list them in EXIT_CODES: {unlisted}"
    assert not gone, f"no longer defined, drop them from EXIT_CODES: {gone}"


@pytest.mark.parametrize("name", sorted(EXIT_CODES))
def test_each_error_derives_from_one_category_and_exits_with_its_code(name: str) -> None:
    error_class = getattr(importlib.import_module(ERRORS[name]), name)
    assert issubclass(error_class, WorkerError)
    categories = [category for category in CATEGORIES if issubclass(error_class, category)]
    assert len(categories) == 1, f"{name} has categories {categories}"
    error = error_class.__new__(error_class)  # its own __init__ may want more than a message
    assert exit_code(error) == CATEGORIES[categories[0]] == EXIT_CODES[name]


@pytest.mark.parametrize(
    ("raised", "code", "line"),
    [
        (ConfigurationError("bad flag"), 2, "sentiment-worker lag: error: bad flag"),
        (OperationError("broker gone"), 1, "sentiment-worker lag: error: broker gone"),
        (KeyboardInterrupt(), 130, ""),
        (RuntimeError("a bug"), 1, "sentiment-worker lag: failed: RuntimeError: a bug"),
    ],
    ids=["configuration", "operation", "interrupt", "unexpected"],
)
def test_main_prints_one_line_and_exits_with_the_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], raised: BaseException, code: int,
    line: str,
) -> None:  # fmt: skip
    def measure_lag(*_args: object, **_kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(lag_command, "measure_lag", measure_lag)
    monkeypatch.setattr(lag_command, "require_broker", lambda *_args, **_kwargs: None)  # no broker here
    # The log (and its traceback) is not stderr's line: a handler an earlier test left on a closed capture
    # stream would print "--- Logging error ---" here.
    monkeypatch.setattr(logging.root, "handlers", [logging.NullHandler()])
    assert main(["lag", "--bootstrap-servers", "127.0.0.1:1"]) == code
    assert capsys.readouterr().err.strip() == line
