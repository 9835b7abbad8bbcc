"""What the benches' options share: a `quick` form with small sizes for a smoke run; the drains' topics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

_Options = TypeVar("_Options", bound="QuickSizes")


class QuickSizes:
    """Mixed into a bench's options dataclass: `quick(**overrides)` is the options with the class's `QUICK`
    sizes, then the overrides that are not None."""

    QUICK: ClassVar[dict[str, Any]] = {}

    @classmethod
    def quick(cls: type[_Options], **overrides: Any) -> _Options:
        """Small sizes for a smoke run; an override of None keeps the quick (or default) value."""
        values = {**cls.QUICK, **{k: v for k, v in overrides.items() if v is not None}}
        make: Callable[..., _Options] = cls
        return make(**values)

    @classmethod
    def sized(cls: type[_Options], quick: bool, **overrides: Any) -> _Options:
        """`quick(**overrides)` when `quick`, else the full run's sizes with the overrides not None."""
        if quick:
            return cls.quick(**overrides)
        make: Callable[..., _Options] = cls
        return make(**{k: v for k, v in overrides.items() if v is not None})


@dataclass(frozen=True)
class DrainOptions(QuickSizes):
    """What every bench that drains a backlog through the broker shares: input partitions, the reviews'
    sampling seed, and whether its topics are kept afterwards."""

    partitions: int = 3
    seed: int = 7
    keep_topics: bool = False
