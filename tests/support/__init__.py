"""What the tests of several areas share: builders of rows, helpers (servers, waits,
requests through the doors, the SDK's wire) and fixtures. The fixtures' modules are
pytest plugins, registered in tests/conftest.py (`pytest_plugins`)."""
