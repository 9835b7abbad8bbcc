"""The house plan, enforced: imports point one way (cli → runtime|tools|bench → the doors kafka|http|files →
labelling → health|metrics → inference → model → config → schemas; the doors never import each other;
training → model; cli|tools|bench → training; and `worker.errors`, which imports nothing of the project, from
every part of worker/), no import loops, no `worker.cli` outside the CLI, no import hidden inside a function
outside the CLI (where it only keeps start-up fast), no underscore name used outside its module, and one name
for a partition key. Read from the source (AST), nothing is imported."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("worker", "schemas")

# What each part may import (besides itself), top down. The three front doors (kafka, http, files) are
# peers: none imports another; each turns its input into reviews for the Labeller (labelling) and its
# predictions into its output. runtime is the composition root (settings → models → Labeller → doors,
# process start-up); tools and bench may use it to build what they measure or operate. worker/errors.py is
# below every part of worker/.
BASE = {"config", "schemas", "errors"}
BELOW_DOORS = {"labelling", "health", "metrics", "inference", "model"} | BASE
DOORS = {"kafka", "http", "files"}
ALLOWED: dict[str, set[str]] = {
    "cli": {"runtime", "tools", "bench", "training"} | DOORS | BELOW_DOORS,
    "tools": {"runtime", "training"} | DOORS | BELOW_DOORS,
    "bench": {"runtime", "training"} | DOORS | BELOW_DOORS,
    "runtime": DOORS | BELOW_DOORS,
    "kafka": BELOW_DOORS,  # never http, files
    "http": BELOW_DOORS,  # never kafka, files
    "files": BELOW_DOORS,  # never kafka, http
    "labelling": {"health", "metrics", "inference", "model"} | BASE,
    "health": {"inference", "model"} | BASE,  # worker/health.py
    "metrics": {"inference", "model"} | BASE,  # worker/metrics.py
    "inference": {"model"} | BASE,
    "training": {"model"} | BASE,
    "model": BASE,
    "config": {"schemas", "errors"},
    "errors": set(),  # worker/errors.py
    "schemas": set(),
    "entry": {"cli"},  # worker/__main__.py
    "root": set(),  # worker/__init__.py
}


@dataclass(frozen=True)
class Import:
    source: str  # importing module, dotted
    target: str  # imported module, dotted (a name imported from a module counts as that module)
    names: tuple[str, ...]
    line: int
    in_function: bool
    type_checking: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


MODULES = {module_name(p) for p in source_files()}


def part_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "schemas":
        return "schemas"
    if len(parts) == 1:
        return "root"
    if parts[1] == "__main__":
        return "entry"
    return parts[1]


def resolve(module: str) -> str:
    """The project module a dotted import lands in (`worker.inference.tuning.TuneOptions` → the package)."""
    while module and module not in MODULES:
        module = module.rpartition(".")[0]
    return module


def imports_of(path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    source = module_name(path)

    def walk(node: ast.AST, in_function: bool, type_checking: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            func = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            guarded = type_checking or (
                isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING")
            )
            if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names = tuple(a.name for a in child.names)
                if child.module.split(".")[0] in PACKAGES:
                    # `from worker.cli import bench` imports the module worker.cli.bench
                    for name in names:
                        sub = f"{child.module}.{name}"
                        target = sub if sub in MODULES else resolve(child.module)
                        yield Import(source, target, (name,), child.lineno, in_function, type_checking)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] in PACKAGES:
                        yield Import(
                            source, resolve(alias.name), (), child.lineno, in_function, type_checking
                        )
            yield from walk(child, func, guarded)

    yield from walk(tree, False, False)


ALL_IMPORTS = [imp for path in source_files() for imp in imports_of(path)]


def where(imp: Import) -> str:
    return f"{imp.source} (line {imp.line}) imports {imp.target}"


def test_the_walk_sees_the_layout() -> None:
    parts = {part_of(m) for m in MODULES}
    assert set(ALLOWED) - {"entry", "root"} <= parts
    assert any(i.source == "worker.kafka.app" and i.target == "worker.kafka.consumer" for i in ALL_IMPORTS)
    assert any(i.in_function for i in ALL_IMPORTS)  # the CLI's lazy imports are seen


def test_imports_point_one_way() -> None:
    wrong = [
        where(i)
        for i in ALL_IMPORTS
        if part_of(i.target) != part_of(i.source) and part_of(i.target) not in ALLOWED[part_of(i.source)]
    ]
    assert not wrong, (
        "imports against the direction cli → runtime|tools|bench → kafka|http|files → labelling → inference"
        " → model:\n" + "\n".join(wrong)
    )


def test_nothing_outside_the_cli_imports_it() -> None:
    users = [
        where(i)
        for i in ALL_IMPORTS
        if part_of(i.target) == "cli" and part_of(i.source) not in ("cli", "entry")
    ]
    assert not users


def test_no_import_is_hidden_inside_a_function_outside_the_cli() -> None:
    hidden = [where(i) for i in ALL_IMPORTS if i.in_function and part_of(i.source) != "cli"]
    assert not hidden, "imports inside functions (a sign of a dodged loop):\n" + "\n".join(hidden)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_loops_between_modules() -> None:
    edges: dict[str, set[str]] = {}
    for i in ALL_IMPORTS:
        # A package's __init__ re-exporting its modules is not a loop with them.
        if not i.type_checking and i.target != i.source and not i.source.startswith(i.target + "."):
            edges.setdefault(i.source, set()).add(i.target)
    assert find_cycle(edges) is None, " → ".join(find_cycle(edges) or [])


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None


def test_no_underscore_name_is_used_outside_its_module() -> None:
    private = [
        f"{where(i)}: {name}"
        for i in ALL_IMPORTS
        for name in i.names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert not private


@pytest.mark.parametrize("path", source_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_shadows_a_confluent_kafka_class(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    shadowing = {"TopicPartition", "Consumer", "Producer", "Message", "KafkaError", "KafkaException"}
    defined: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
    assert not defined & shadowing


def test_one_name_for_a_partition_key() -> None:
    definitions = [
        module_name(p)
        for p in source_files()
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) for t in node.targets)
        and ast.unparse(node.value) == "tuple[str, int]"
    ]
    assert definitions == ["worker.kafka.offsets"]
