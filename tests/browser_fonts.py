"""Whether Chromium can draw the page's Chinese: a CJK font fontconfig knows (`fc-list :lang=zh`). Without
one the page test would pass while a person sees boxes; `make browser` installs fonts-wqy-zenhei."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

FONT_FIX = (
    "no Chinese (CJK) font is installed (`fc-list :lang=zh` lists none): Chromium would draw the page's "
    "Chinese as boxes; run `make browser` (apt-get install fonts-wqy-zenhei)"
)


def fc_list_zh() -> str:
    """`fc-list :lang=zh family`'s output ("" when fc-list is missing)."""
    try:
        done = subprocess.run(
            ["fc-list", ":lang=zh", "family"], capture_output=True, text=True, timeout=30, check=False
        )
    except FileNotFoundError:
        return ""
    return done.stdout


def cjk_font_problem(fc_list: Callable[[], str] = fc_list_zh) -> str | None:
    """None when a CJK font is present, else what to do (`FONT_FIX`)."""
    return None if fc_list().strip() else FONT_FIX
