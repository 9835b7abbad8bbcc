"""Each part takes its section: the whole `WorkerSettings` is taken (as a parameter or a field) only by the
settings package, the composition root, the command line and the few tools that span sections; nothing
outside worker/config asks pydantic which settings were given (the sections say `<setting>_given`). Read
from the source (AST), nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

TAKE_THE_WHOLE_SETTINGS = {
    "worker.config.sources": "environment_warnings: the environment against every setting",
    "worker.runtime.root": "the composition root: settings → Labeller → doors",
    "worker.runtime.processes": "run --processes: each child's settings derived from the parent's",
    "worker.tools.doctor": "run_checks: every section is checked",
    "worker.bench.bench": "starts worker processes with the bench's settings",
    "worker.bench.host_ceiling": "the same, on the identity backend",
    "worker.bench.worker_process": "writes a worker's config file and flags from the settings",
    "worker.bench.model_table": "derives a worker's settings per model (EndToEnd)",
    "worker.bench.shadow_cost": "starts worker processes with and without a shadow (bench --shadow)",
    "worker.bench.model_swaps": "starts the worker process whose primary it swaps (bench --swaps)",
}
"""Modules outside worker/cli that take the whole settings, each with why."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def worker_modules() -> dict[str, ast.Module]:
    return {
        module_name(path): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted((ROOT / "worker").rglob("*.py"))
    }


def takers(tree: ast.Module) -> list[str]:
    """The functions with a parameter, and the classes with a field, annotated with WorkerSettings."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            if any(
                a.annotation is not None and "WorkerSettings" in ast.unparse(a.annotation) for a in arguments
            ):
                found.append(node.name)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and "WorkerSettings" in ast.unparse(item.annotation):
                    found.append(f"{node.name}.{ast.unparse(item.target)}")
    return found


def test_only_the_root_the_cli_and_spanning_tools_take_the_whole_settings() -> None:
    taking = {
        module: names
        for module, tree in worker_modules().items()
        if (names := takers(tree)) and not module.startswith("worker.cli")
    }
    unexpected = {module: names for module, names in taking.items() if module not in TAKE_THE_WHOLE_SETTINGS}
    assert not unexpected, f"take the section(s) they use instead of WorkerSettings: {unexpected}"
    assert set(taking) == set(TAKE_THE_WHOLE_SETTINGS)  # a module that stopped leaves the list


def test_nothing_outside_the_settings_package_branches_on_which_settings_were_given() -> None:
    asking = [
        module
        for module, tree in worker_modules().items()
        if not module.startswith("worker.config")
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "model_fields_set"
    ]
    assert not asking, f"read the section's <setting>_given instead: {asking}"


def test_the_walk_sees_a_taker() -> None:
    tree = ast.parse("def f(settings: WorkerSettings) -> None: ...\nclass C:\n    settings: WorkerSettings\n")
    assert takers(tree) == ["f", "C.settings"]
