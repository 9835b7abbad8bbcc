"""A check's verdict, as `doctor` reports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Verdict = Literal["OK", "WARN", "FAIL"]


@dataclass(frozen=True)
class Check:
    """One verdict. `fix`: the command or setting that fixes a FAIL, when the detail does not already say."""

    name: str
    verdict: Verdict
    detail: str
    fix: str | None = None

    def line(self) -> str:
        """`[FAIL] broker: <what was found>; fix: <what to run>` (the report's line)."""
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"[{self.verdict:4}] {self.name}: {self.detail}{fix}"
