"""The mutation run's annotation filter (tests/mutation_annotations.py): only stretches wholly inside an
annotation that is never evaluated count as equivalent; the code around them stays mutated."""

from __future__ import annotations

from tests.mutation_annotations import annotation_spans, inside_annotation

POSTPONED = """from __future__ import annotations

LIMIT: int | None = None


def f(x: int | None, *rest: str) -> list[int]:
    y: dict[str, int] = {}
    return [x | 1] if x is not None else list(y.values())
"""


def _span(line: int, needle: str, last: bool = False) -> tuple[tuple[int, int], tuple[int, int]]:
    """Where `needle` stands on `line` of POSTPONED (its last occurrence with `last`)."""
    text = POSTPONED.splitlines()[line - 1]
    col = text.rindex(needle) if last else text.index(needle)
    return (line, col), (line, col + len(needle))


def test_mutants_inside_annotations_are_equivalent_and_the_code_is_not() -> None:
    spans = annotation_spans(POSTPONED)
    annotations = [(3, "int | None"), (6, "int | None"), (6, "str"), (6, "list[int]"), (7, "dict[str, int]")]
    for line, needle in annotations:
        assert inside_annotation(*_span(line, needle), spans), (line, needle)
    # The body's `x | 1`, a default value and an assigned value are code: they stay mutated.
    for line, needle in [(8, "x | 1"), (8, "None"), (7, "{}")]:
        assert not inside_annotation(*_span(line, needle), spans), (line, needle)
    assert not inside_annotation(*_span(3, "None", last=True), spans)  # `= None`, not `int | None`


def test_a_stretch_that_only_starts_in_an_annotation_is_not_skipped() -> None:
    spans = annotation_spans(POSTPONED)
    (line, col), _ = _span(6, "list[int]")
    assert not inside_annotation((line, col), (7, 5), spans)


def test_a_module_that_evaluates_its_annotations_skips_nothing() -> None:
    evaluated = POSTPONED.replace("from __future__ import annotations\n", "")
    assert annotation_spans(evaluated) == []
