"""The test run's own summary: each skip reason once, with its count."""

import types

from conftest import pytest_terminal_summary


class _Reporter:
    def __init__(self, skipped):
        self.stats = {"skipped": skipped} if skipped is not None else {}
        self.lines = []

    def section(self, title):
        self.lines.append(f"== {title}")

    def write_line(self, line):
        self.lines.append(line)


def _skip(reason, where="tests/test_x.py"):
    return types.SimpleNamespace(longrepr=(where, 3, f"Skipped: {reason}"))


def test_each_skip_reason_is_written_once_with_its_count_most_first():
    driver = "needs a GPU: session: no CUDA driver on this machine (libcuda could not be loaded)"
    reporter = _Reporter(
        [_skip(driver, f"tests/test_{i}.py") for i in range(136)]
        + [_skip("could not import 'torch'")]
    )
    pytest_terminal_summary(reporter)
    assert reporter.lines == [
        "== skipped, by reason",
        f"  136  {driver}",
        "    1  could not import 'torch'",
    ]


def test_a_run_without_skips_writes_nothing():
    for skipped in (None, []):
        reporter = _Reporter(skipped)
        pytest_terminal_summary(reporter)
        assert reporter.lines == []
