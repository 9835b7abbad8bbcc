"""The page test fails, saying what to install, when no CJK font is there (Chromium would draw boxes)."""

from __future__ import annotations

from tests.browser_fonts import FONT_FIX, cjk_font_problem


def test_no_cjk_font_is_a_problem_naming_the_package() -> None:
    assert cjk_font_problem(lambda: "") == FONT_FIX
    assert "fonts-wqy-zenhei" in FONT_FIX and "make browser" in FONT_FIX and "fc-list :lang=zh" in FONT_FIX


def test_a_cjk_font_is_enough() -> None:
    assert cjk_font_problem(lambda: "WenQuanYi Zen Hei,文泉驛正黑\n") is None
