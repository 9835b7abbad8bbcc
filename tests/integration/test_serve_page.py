"""The page at `/` in a real headless Chromium (Debian's chromium + chromium-driver, `make browser`):
reviews typed one per line, submitted, labels read back from the table; the screenshot is kept in
var/test-artifacts/."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from tests.browser_fonts import cjk_font_problem
from tests.integration.helpers import SAMPLES
from tests.integration.serve_helpers import serving
from worker.files.predict import predict_lines
from worker.labelling.labeller import Labeller

ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "test-artifacts"
TEXTS = [json.loads(line)["text"] for line in SAMPLES.read_text(encoding="utf-8").splitlines()][:5]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:  # a failure, not a skip: `make test` installs them
        pytest.fail(
            "chromium and chromedriver are needed: run `make browser` "
            "(apt-get install chromium chromium-driver)"
        )
    problem = cjk_font_problem()
    if problem is not None:  # the page would render, its Chinese as boxes
        pytest.fail(problem)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,800"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


def test_a_person_pastes_reviews_and_reads_the_labels(browser: Any, tiny_classifier: Any) -> None:
    expected = [row["label"] for row in predict_lines(Labeller.of(tiny_classifier), TEXTS)]
    with serving(tiny_classifier) as served:
        browser.get(served.url + "/")
        box = browser.find_element(By.ID, "reviews")
        box.send_keys("\n".join(TEXTS) + "\n\n")  # a trailing blank line is ignored
        browser.find_element(By.ID, "submit").click()
        wait = WebDriverWait(browser, 30)
        wait.until(expected_conditions.text_to_be_present_in_element((By.ID, "status"), "labelled"))
        rows = browser.find_elements(By.CSS_SELECTOR, "#results tbody tr")
        labels = [row.find_element(By.CSS_SELECTOR, "td.label").text for row in rows]
        texts = [row.find_element(By.CSS_SELECTOR, "td.text").text for row in rows]
        bars = [row.find_element(By.CSS_SELECTOR, ".bar > span").get_attribute("style") for row in rows]
        model = browser.find_element(By.ID, "model").text
        elapsed = browser.find_element(By.ID, "elapsed").text
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "serve-page.png"
        assert browser.save_screenshot(str(shot))

    assert texts == TEXTS
    assert labels == expected
    assert all("width:" in style for style in bars)  # a confidence bar per row
    assert model.startswith(tiny_classifier.name) and tiny_classifier.version in model
    assert elapsed.endswith(")") and " ms (server " in elapsed
    assert shot.stat().st_size > 10_000


def test_the_page_shows_a_refusal(browser: Any, tiny_classifier: Any) -> None:
    with serving(tiny_classifier, api_token="page-token") as served:
        browser.get(served.url + "/")
        browser.find_element(By.ID, "reviews").send_keys(TEXTS[0])
        browser.find_element(By.ID, "submit").click()
        WebDriverWait(browser, 30).until(
            expected_conditions.text_to_be_present_in_element((By.ID, "status"), "401")
        )
        refused = browser.find_element(By.ID, "status").text
        browser.find_element(By.ID, "token").send_keys("page-token")
        browser.find_element(By.ID, "submit").click()
        WebDriverWait(browser, 30).until(
            expected_conditions.text_to_be_present_in_element((By.ID, "status"), "labelled")
        )
        labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#results tbody td.label")]
        # A refused submission leaves no earlier answer on screen as if it were its own.
        browser.find_element(By.ID, "token").clear()
        browser.find_element(By.ID, "submit").click()
        WebDriverWait(browser, 30).until(
            expected_conditions.text_to_be_present_in_element((By.ID, "status"), "401")
        )
        rows_after_refusal = browser.find_elements(By.CSS_SELECTOR, "#results tbody tr")
        table_shown = browser.find_element(By.ID, "results").is_displayed()
        model_after_refusal = browser.find_element(By.ID, "model").text
    assert "unauthorized" in refused
    assert labels == [next(predict_lines(Labeller.of(tiny_classifier), TEXTS[:1]))["label"]]
    assert rows_after_refusal == [] and not table_shown and model_after_refusal == "—"


def test_every_valid_line_is_labelled_and_each_bad_one_gets_its_own_error(
    browser: Any, tiny_classifier: Any
) -> None:
    limit = 300
    long_review = (TEXTS[1] * 40)[:250]  # labelled, shown folded to 200 characters
    too_long = "好" * (limit + 1)  # refused by its own row: the other lines are still labelled
    lines = [TEXTS[0], "", long_review, too_long, TEXTS[2]]
    expected = [
        row["label"] for row in predict_lines(Labeller.of(tiny_classifier), [TEXTS[0], long_review, TEXTS[2]])
    ]
    with serving(tiny_classifier, max_text_chars=limit, http_max_texts=2) as served:
        browser.get(served.url + "/")
        # Set at once: typing 500 characters through chromedriver is slow and not what is tested.
        browser.execute_script("document.getElementById('reviews').value = arguments[0];", "\n".join(lines))
        browser.find_element(By.ID, "submit").click()
        WebDriverWait(browser, 30).until(
            expected_conditions.text_to_be_present_in_element((By.ID, "status"), "labelled")
        )
        status = browser.find_element(By.ID, "status").text
        rows = browser.find_elements(By.CSS_SELECTOR, "#results tbody tr")
        numbers = [row.find_element(By.CSS_SELECTOR, "td.index").text for row in rows]
        labels = [row.find_element(By.CSS_SELECTOR, "td.label").text for row in rows]
        reason = rows[2].find_element(By.CSS_SELECTOR, "td.reason").text
        review = rows[1].find_element(By.CSS_SELECTOR, "span.review")
        folded = review.text
        fold_button = rows[1].find_element(By.CSS_SELECTOR, "button.fold")
        fold_label = fold_button.text
        fold_button.click()
        expanded = review.text
        # An empty submission clears the table too.
        browser.execute_script("document.getElementById('reviews').value = '';")
        browser.find_element(By.ID, "submit").click()
        WebDriverWait(browser, 30).until(
            expected_conditions.text_to_be_present_in_element((By.ID, "status"), "at least one")
        )
        rows_after_empty = browser.find_elements(By.CSS_SELECTOR, "#results tbody tr")
        icon = httpx.get(served.url + "/favicon.ico")

    assert numbers == ["1", "3", "4", "5"]  # textarea line numbers, from 1; the blank line 2 is skipped
    assert labels == [expected[0], expected[1], "text_too_long", expected[2]]
    assert reason == f"line 4 has {limit + 1} characters; at most {limit}"
    assert "3 review(s) labelled; 1 line(s) not labelled" in status
    assert folded == long_review[:200] + "…" and "250" in fold_label
    assert expanded == long_review
    assert rows_after_empty == []
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/vnd.microsoft.icon"
    assert icon.content[:4] == b"\x00\x00\x01\x00" and b"PNG" in icon.content[:32]
