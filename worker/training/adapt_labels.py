"""How a team's own column becomes a label for `adapt`: label words (0/1, negative/positive, 负面/正面,
差评/好评 …) or star ratings cut at two thresholds (the middle dropped by default). Pure functions; the files
door reads the rows, `worker.tools.adapt_rows` applies these rules to them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from worker.training.corpus import NEGATIVE, POSITIVE

NEGATIVE_WORDS: Final = frozenset(
    {"0", "negative", "neg", "bad", "-1", "负面", "负", "消极", "差评", "差", "不满意", "否定"}
)
POSITIVE_WORDS: Final = frozenset(
    {"1", "positive", "pos", "good", "正面", "正", "积极", "好评", "好", "满意", "肯定"}
)
DROPPED: Final = None
"""What `LabelRule.label_of` returns for a row it leaves out on purpose (a middle rating)."""


@dataclass(frozen=True)
class LabelRule:
    """Where a row's label comes from: the column `field` holds a label word (`rating=False`) or a star
    rating (`rating=True`: ≤ `negative_max` negative, ≥ `positive_min` positive, in between dropped)."""

    field: str
    rating: bool = False
    negative_max: float = 2.0
    positive_min: float = 4.0

    def __post_init__(self) -> None:
        if self.rating and self.negative_max >= self.positive_min:
            raise ValueError(
                f"--negative-max {self.negative_max:g} must be below --positive-min {self.positive_min:g}"
            )

    def label_of(self, value: object) -> int | None:
        """The label id of a cell or JSON value, None for a rating between the thresholds; ValueError says
        what is wrong with any other value."""
        return self._rating(value) if self.rating else label_word(value)

    def _rating(self, value: object) -> int | None:
        if isinstance(value, bool) or value is None:
            raise ValueError(f"rating {value!r} is not a number")
        text = str(value).strip().replace("星", "").replace("分", "")
        try:
            stars = float(text)
        except ValueError:
            raise ValueError(f"rating {value!r} is not a number") from None
        if stars != stars:  # NaN
            raise ValueError(f"rating {value!r} is not a number")
        if stars <= self.negative_max:
            return NEGATIVE
        if stars >= self.positive_min:
            return POSITIVE
        return DROPPED

    def describe(self) -> str:
        """One line for the output: which column, and how it becomes a label."""
        if not self.rating:
            return f"labels from `{self.field}` (0/1, negative/positive, 负面/正面, 差评/好评 …)"
        return (
            f"labels from ratings in `{self.field}`: ≤ {self.negative_max:g} negative, ≥ "
            f"{self.positive_min:g} positive, in between dropped"
        )


def label_word(value: object) -> int:
    """The label id of a label word (any case, surrounding spaces ignored); ValueError otherwise."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"label {value!r} is not a label word (0/1, negative/positive, 负面/正面 …)")
    key = str(value).strip().lower()
    if key in NEGATIVE_WORDS:
        return NEGATIVE
    if key in POSITIVE_WORDS:
        return POSITIVE
    raise ValueError(f"label {value!r} is not a label word (0/1, negative/positive, 负面/正面, 差评/好评 …)")
