"""Prints the wire fuzzer's outcome counts at the end of the run (no -s needed)."""


def pytest_terminal_summary(terminalreporter):
    from .test_wire_fuzz import SUMMARY
    if SUMMARY:
        terminalreporter.section("wire fuzz")
        for text in SUMMARY:
            terminalreporter.write_line(text)
