"""Browser tests: Playwright driving Debian's Chromium (`apt-get install chromium`;
.ci/run installs it). Without it these tests are skipped with that hint."""

import shutil

import pytest

# the console tour's small but busy system, for the tests that look at every page
from tests.web.browser.test_console_tour import world  # noqa: F401 - a fixture

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def pytest_collection_modifyitems(config, items):
    if CHROMIUM:
        return
    skip = pytest.mark.skip(reason="no Chromium: 'apt-get install chromium' runs these tests")
    for item in items:
        if "tests/web/browser/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        # no lookups of Google's hosts from this offline machine
        "args": ["--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1"],
    }
