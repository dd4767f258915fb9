"""The browser for the tests marked `browser`: Playwright driving Debian's Chromium
(`apt-get install chromium`; .ci/run installs it). Without it those tests are skipped
with that hint."""

import shutil

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def pytest_collection_modifyitems(config, items):
    if CHROMIUM:
        return
    skip = pytest.mark.skip(reason="no Chromium: 'apt-get install chromium' runs these tests")
    for item in items:
        if item.get_closest_marker("browser") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        # no lookups of Google's hosts from this offline machine
        "args": ["--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1"],
    }
