"""Debian's headless Chromium, driven by Selenium through the system ``chromedriver``
(nothing downloads): for the dashboard's browser tests, its benchmark and the screenshots
in docs/dashboard.md. Selenium is a test extra (``pip install -e '.[test]'``); the
browser is Debian's ``chromium`` and ``chromium-driver`` (``make test`` installs them)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"
# root needs --no-sandbox; without the background-networking flags Chromium stalls on a
# closed network (it waits on its own update and sync services)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000")


def missing() -> str:
    """Why no browser can start here ('' when one can)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} is missing: apt-get install chromium chromium-driver"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is missing: pip install -e '.[test]'"
    return ""


@contextmanager
def browser(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A fresh headless Chromium (its own profile folder, removed after)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="phalanx-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.add_argument(f"--window-size={width},{height}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def console_errors(driver: Any) -> list[str]:
    """The browser console's errors since the last call (the log is drained)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def wait_ready(driver: Any, timeout: float = 10.0) -> float:
    """Wait until the page has drawn its view; the ms from navigation start to then."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(
        lambda d: d.execute_script("return document.body && document.body.dataset.ready") == "1")
    return float(driver.execute_script("return window.PXReadyAt || performance.now()"))
