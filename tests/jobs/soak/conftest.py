"""Show the soak test's figures in the terminal summary: they reach it as a property of
the test's report, so they show under pytest-xdist too (whose workers' output does not)."""

FIGURES = "soak figures"  # the property test_soak.py records


def pytest_terminal_summary(terminalreporter):
    shown = False
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, value in getattr(report, "user_properties", ()):
                if name == FIGURES and getattr(report, "when", "") == "call":
                    if not shown:
                        terminalreporter.section(FIGURES)
                        shown = True
                    terminalreporter.write_line(value)
