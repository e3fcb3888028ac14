"""Takes the screenshots of docs/dashboard.md with the headless browser the tests use.

    python docs/dashboard/screenshots.py URL VIEW=FRAGMENT ...   # e.g. runs=runs
Each VIEW is saved as docs/dashboard/VIEW.png once the page has drawn it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from phalanx.dashboard.headless import browser, console_errors, wait_ready

HERE = Path(__file__).parent


def main(url: str, views: list[str]) -> None:
    with browser(1300, 900) as driver:
        for view in views:
            name, fragment = view.split("=", 1)
            driver.get(url + "#" + fragment)
            driver.refresh()
            ms = wait_ready(driver, timeout=60)
            time.sleep(0.5)
            driver.save_screenshot(str(HERE / f"{name}.png"))
            print(f"{name}: drawn in {ms:.0f} ms; console errors: {console_errors(driver)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
