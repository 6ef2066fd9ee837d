"""A headless Chromium driven by Selenium, from Debian's packages (``deploy/local/browser.sh`` installs
them when missing). No browser is a failure, not a skip: the console must be tested in CI."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def browser_paths() -> tuple[str, str]:
    done = subprocess.run(
        ["bash", str(ROOT / "deploy" / "local" / "browser.sh")], capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        pytest.fail(f"no headless Chromium for the console test:\n{done.stderr}", pytrace=False)
    browser, driver = done.stdout.split()
    return browser, driver


@pytest.fixture
def browser(browser_paths: tuple[str, str], tmp_path: Path) -> Iterator[webdriver.Chrome]:
    binary, driver = browser_paths
    options = Options()
    options.binary_location = binary
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,860",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # test_console reads CSP refusals
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield chrome
    finally:
        chrome.quit()
