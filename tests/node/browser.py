"""Headless Debian Chromium for the browser tests, driven by selenium: one driver per test, with
its own profile folder, quit however the test ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


@contextmanager
def chromium(
    profile: Path, *flags: str, window: str = "1280,1000", performance_log: bool = False
) -> Iterator:
    """A headless Chromium driver whose profile lives in `profile`, with `flags` added; skips the
    test where Debian's chromium and chromium-driver are not installed."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip("needs Debian's chromium and chromium-driver (scripts/setup --test installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", f"--window-size={window}",
                 f"--user-data-dir={profile}", *flags):
        opts.add_argument(flag)
    if performance_log:
        opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
