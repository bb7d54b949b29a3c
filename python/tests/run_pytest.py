#!/usr/bin/env python3
"""Runs the Python package's tests with pytest and closes with the plain line
"N passed, N failed, N skipped" that tests/run_tests.sh folds into its total.

    python3 python/tests/run_pytest.py [PATH...] [-- PYTEST ARGS]

Without numpy or pytest the run counts as one skipped test (saying why), or
as one failed test when MEGAMOE_REQUIRE_PYTHON_TESTS=1 (CI). pytest finding
no test at all counts as a failure. Set MEGAMOE_LIBRARY and PYTHONPATH as
tests/run_tests.sh does to test a build of the repository.
"""

import importlib.util
import os
import sys


class _Counter:
    """Counts test outcomes the way the C runners do: one per test."""

    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            if report.passed:
                self.passed += 1
            elif report.failed:
                self.failed += 1
            else:
                self.skipped += 1
        elif report.failed:  # an error in setup or teardown
            self.failed += 1
        elif report.skipped and report.when == "setup":
            self.skipped += 1

    def pytest_collectreport(self, report):
        if report.failed:
            self.failed += 1


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    paths, extra = argv, []
    if "--" in argv:
        i = argv.index("--")
        paths, extra = argv[:i], argv[i + 1:]
    paths = paths or [here]
    require = os.environ.get("MEGAMOE_REQUIRE_PYTHON_TESTS") == "1"
    missing = [m for m in ("pytest", "numpy") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"python tests: {' and '.join(missing)} not importable by {sys.executable}: "
              + ("failed (MEGAMOE_REQUIRE_PYTHON_TESTS=1)" if require else
                 "skipped (python3 -m pip install numpy pytest runs them)"))
        print("0 passed, 1 failed, 0 skipped" if require else "0 passed, 0 failed, 1 skipped")
        return 1 if require else 0
    import pytest

    counter = _Counter()
    rc = pytest.main(["-q", "-rs", "-p", "no:cacheprovider", *paths, *extra], plugins=[counter])
    if rc == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("python tests: pytest collected no test")
        counter.failed += 1
    print(f"{counter.passed} passed, {counter.failed} failed, {counter.skipped} skipped")
    return 0 if rc == 0 and counter.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
