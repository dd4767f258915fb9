"""The console's browser tests (marked `browser`: tests/support/browser.py launches
Debian's Chromium for them, or skips them with the hint to install it)."""

# the console tour's small but busy system, for the tests that look at every page
from tests.web.browser.test_console_tour import world  # noqa: F401 - a fixture
