"""The web console (I7) in a real browser: the worked example's shares with the right figures, updated
live; a job's explanation and start estimate; a priority changed from the page and the preemption it causes.

Screenshots of each page are taken every run; ``UPDATE_SCREENSHOTS=1`` writes them to docs/img/ (shown in
the README and docs/operations.md).
"""

from __future__ import annotations

import os
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from gpuquota.gateway.auth import Keyring
from tests.gateway.conftest import wait_for
from tests.gateway.helpers import G5, share_arn, status, submit, worked_example
from tests.observe.helpers import get_json, stack

T = TypeVar("T")
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "img"
FIGURES = ("limit", "maximum", "used", "borrowed", "lent", "queued")


def console_token(page: str) -> str:
    """The console token in the served ``index.html`` (``gpuquota.gateway.browser_guard``)."""
    found = re.search(r'<meta name="gpuquota-console-token" content="([^"]+)">', page)
    assert found is not None, page
    return found.group(1)


def until(browser: Chrome, condition: Callable[[Chrome], T], timeout: float = 30) -> T:
    """Wait for ``condition`` (re-rendered elements may go stale between two polls: try again)."""

    def check(driver: Chrome) -> T | bool:
        try:
            return condition(driver)
        except (StaleElementReferenceException, WebDriverException):
            return False

    return cast(T, WebDriverWait(browser, timeout, poll_frequency=0.1).until(check))


def click(browser: Chrome, by: str, what: str) -> None:
    """Click the element (found again if a live update replaced it meanwhile)."""

    def clicked(driver: Chrome) -> bool:
        driver.find_element(by, what).click()
        return True

    until(browser, clicked)


def text_of(by: str, what: str, expected: str) -> Callable[[Chrome], bool]:
    return lambda browser: browser.find_element(by, what).text == expected


def share_figures(browser: Chrome) -> dict[str, tuple[str, ...]]:
    rows = browser.find_elements(By.CSS_SELECTOR, f'table.shares tr[data-unit="{G5}"]')
    return {
        row.get_attribute("data-share") or "": tuple(row.find_element(By.CLASS_NAME, f).text for f in FIGURES)
        for row in rows
    }


def preemption_cells(browser: Chrome) -> dict[str, str]:
    rows = browser.find_elements(By.CSS_SELECTOR, f'table.shares tr[data-unit="{G5}"]')
    return {
        row.get_attribute("data-share") or "": row.find_element(By.CLASS_NAME, "preemption").text
        for row in rows
    }


def shows(expected: dict[str, tuple[str, ...]]) -> Callable[[Chrome], bool]:
    return lambda browser: share_figures(browser) == expected


def screenshot(browser: Chrome, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"console-{name}.png"
    assert browser.save_screenshot(str(path)) and path.stat().st_size > 10_000
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(path, IMAGES / path.name)


def test_console_follows_the_worked_example(browser: Chrome, tmp_path: Path) -> None:
    running = stack(data_dir=tmp_path / "stack")
    try:
        batch = running.client
        worked_example(batch)
        # S10's opt-in hygiene on QS3 (no effect on the worked example: QS3 never runs nor borrows)
        hygiene = {"gpuquota:minRuntimeSeconds": "600", "gpuquota:reborrowBackoffSeconds": "120"}
        batch.tag_resource(resourceArn=share_arn("QS3"), tags=hygiene)
        ids = {
            n: submit(batch, n, "QS1", p)
            for n, p in (("qs1_job_high", 3), ("qs1_job_med", 2), ("qs1_job_low", 1))
        }
        wait_for(lambda: status(batch, ids["qs1_job_med"]) == "RUNNING", timeout=30)

        browser.get(running.url + "/console/")
        # step 1: high in quota, med borrows QS2's idle instance, low waits (QS3's is reserved)
        until(
            browser,
            shows(
                {
                    "QS1": ("1", "3", "2", "1", "0", "1"),
                    "QS2": ("1", "1", "0", "0", "1", "0"),
                    "QS3": ("1", "1", "0", "0", "0", "0"),
                }
            ),
        )
        # each share's preemption settings, as gpuquota shares shows them
        assert preemption_cells(browser) == {
            "QS1": "in-share",
            "QS2": "-",
            "QS3": "min runtime 600s, reborrow backoff 120s",
        }
        screenshot(browser, tmp_path, "overview")
        # the bars' geometry, set through the CSSOM (the Content-Security-Policy forbids style attributes)
        used = browser.find_element(By.CSS_SELECTOR, 'tr[data-share="QS1"] .bar .used')
        assert used.value_of_css_property("width") not in ("", "0px", "auto")

        # step 2, through boto3: the page follows by itself (live updates)
        ids["qs2_job_1"] = submit(batch, "qs2_job_1", "QS2", 1)
        until(
            browser,
            shows(
                {
                    "QS1": ("1", "3", "1", "0", "0", "2"),
                    "QS2": ("1", "1", "1", "0", "0", "0"),
                    "QS3": ("1", "1", "0", "0", "0", "0"),
                }
            ),
        )

        # the jobs list, filtered to QS1, then qs1_job_low's page and its explanation
        click(browser, By.CSS_SELECTOR, 'table.shares tr[data-share="QS1"] a')
        until(browser, lambda b: len(b.find_elements(By.CSS_SELECTOR, "table.jobs tr[data-job]")) == 3)
        screenshot(browser, tmp_path, "jobs")
        click(browser, By.LINK_TEXT, "qs1_job_low")
        _, explained = get_json(
            f"{running.url}/gpuquota/v1/jobs/{urllib.parse.quote(ids['qs1_job_low'])}/explain"
        )
        message = explained["explanation"]["message"]
        assert message
        until(browser, text_of(By.CSS_SELECTOR, "#job-explanation .message", message))
        # and when it should start: the estimate of gpuquota explain, with what it assumed
        until(browser, lambda b: b.find_element(By.ID, "likely-start").text.endswith(")"))
        estimate_box = browser.find_element(By.ID, "job-estimate").text
        assert "likely start" in estimate_box and "latest start" in estimate_box
        assert browser.find_element(By.ID, "latest-start").text == "no bound"  # no job has a timeout
        assumed = [
            li.text for li in browser.find_elements(By.CSS_SELECTOR, "#job-estimate ul.assumptions li")
        ]
        assert "no new submissions; preempted jobs stop at once" in assumed
        assert any(line.startswith("likely: running jobs end at") for line in assumed)

        # step 3 from the page: qs1_job_low's priority 1 -> 4 preempts qs1_job_high (in-share)
        field = browser.find_element(By.ID, "priority")
        field.clear()
        field.send_keys("4")
        click(browser, By.ID, "set-priority")
        until(browser, text_of(By.ID, "job-status", "RUNNING"))
        until(browser, text_of(By.ID, "job-priority", "4"))
        browser.get(f"{running.url}/console/#/job/{ids['qs1_job_high']}")
        until(browser, text_of(By.CSS_SELECTOR, "table.preemptions td.kind", "IN_SHARE"))
        until(browser, text_of(By.ID, "job-preempted", "1"))
        lost = browser.find_element(By.CSS_SELECTOR, "table.preemptions td.lost").text  # S12
        assert lost.endswith("GPU-s") and "\u00d7 1 GPUs" in lost, lost
        screenshot(browser, tmp_path, "job")
        assert status(batch, ids["qs1_job_high"]) == "RUNNABLE"

        browser.get(f"{running.url}/console/#/nodes")
        until(browser, lambda b: len(b.find_elements(By.CSS_SELECTOR, ".node .slot.busy")) == 2)
        screenshot(browser, tmp_path, "nodes")
        # nothing on the pages broke the Content-Security-Policy (Chromium logs every refusal)
        logged = [entry["message"] for entry in browser.get_log("browser")]  # type: ignore[no-untyped-call]
        assert not [m for m in logged if "Content Security Policy" in m], logged
    finally:
        running.close()


def test_console_is_read_only_with_authentication_on(tmp_path: Path) -> None:
    running = stack(auth=Keyring([]))
    try:
        code, overview = get_json(running.url + "/console/api/overview")
        assert (code, overview["readOnly"]) == (200, True)
        with urllib.request.urlopen(running.url + "/console/", timeout=10) as response:
            token = console_token(response.read().decode())
        request = urllib.request.Request(
            running.url + "/console/api/jobs/x/terminate",
            data=b"{}",
            method="POST",
            headers={"Content-Type": "application/json", "X-Gpuquota-Console-Token": token},
        )
        try:
            urllib.request.urlopen(request, timeout=10)
            raise AssertionError("a write was accepted with authentication on")
        except urllib.error.HTTPError as exc:
            assert exc.code == 403
            assert "read-only" in exc.read().decode()  # refused as read-only, not for want of the token
    finally:
        running.close()
