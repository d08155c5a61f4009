"""Browser tests of the management web UI (warren/mgmt/ui, served at / by the management
listener): a headless Chromium driven by selenium through the system chromedriver (Debian's
`chromium` and `chromium-driver` packages), against a `warren server` of their own.

Without Chromium, chromedriver or selenium they are skipped; with CI=true or
WARREN_REQUIRE_BROWSER=1 (.ci/run sets it after installing the packages) they fail instead.

WARREN_UI_SCREENSHOTS=DIR makes them save the docs' screenshots (overview.png, queues.png,
queue.png: docs/ui/, shown in docs/management.md and the README) there."""

import os
import shutil

import pytest

REQUIRED = os.environ.get("CI") == "true" or os.environ.get("WARREN_REQUIRE_BROWSER") == "1"

CHROMIUM = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WINDOW = (1280, 900)


def _which(names: tuple[str, ...], fallback: str) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return fallback if os.access(fallback, os.X_OK) else None


def browser_binaries() -> tuple[str, str]:
    """(chromium, chromedriver), or skip the test (fail it where the browser is required)."""
    chromium = _which(CHROMIUM, "/usr/bin/chromium")
    driver = _which(("chromedriver",), "/usr/bin/chromedriver")
    missing = []
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[test]')")
    if chromium is None:
        missing.append("chromium (apt-get install chromium)")
    if driver is None:
        missing.append("chromedriver (apt-get install chromium-driver)")
    if missing:
        message = "the web UI's browser tests need " + ", ".join(missing)
        if REQUIRED:
            pytest.fail(f"{message} (CI=true or WARREN_REQUIRE_BROWSER=1: they must run)")
        pytest.skip(message)
    assert chromium is not None and driver is not None
    return chromium, driver


@pytest.fixture(scope="module")
def chrome(tmp_path_factory):
    """A headless Chromium at 1280x900 that keeps its console log (goog:loggingPrefs)."""
    chromium, driver = browser_binaries()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={WINDOW[0]},{WINDOW[1]}", "--force-device-scale-factor=1",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--password-store=basic",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    log_path = str(tmp_path_factory.mktemp("chromedriver") / "chromedriver.log")
    browser = webdriver.Chrome(service=Service(driver, log_output=log_path), options=options)
    browser.set_page_load_timeout(30)
    # The page's viewport itself 1280x900 (the window's size includes what headless keeps for
    # its frame): the screenshots in docs/ui/ are that size.
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": WINDOW[0], "height": WINDOW[1], "deviceScaleFactor": 1, "mobile": False})
    try:
        yield browser
    finally:
        browser.quit()
