"""Runs the chart tests (test_*.py beside this file) and closes with a plain
'N passed, N failed' line. Exits non-zero when a test fails, errors, or when
no test ran at all.

    source scripts/helm-venv.sh && export GRACEGUARD_HELM=... GRACEGUARD_HELM3=... &&
      "$GRACEGUARD_PY" scripts/chart-tests/run.py [-v] [PATTERN]

PATTERN (optional) keeps only the tests whose id contains it.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True  # keep the work tree free of __pycache__

import time  # noqa: E402
import unittest  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent


def iter_tests(suite: unittest.TestSuite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from iter_tests(t)
        else:
            yield t


class Result(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passed = 0
        self.failed_ids: list[str] = []
        self._failed_now = False

    def startTest(self, test):
        self._failed_now = False
        super().startTest(test)

    def addSubTest(self, test, subtest, err):
        if err is not None:
            self._failed_now = True
        super().addSubTest(test, subtest, err)

    def _failed(self, test):
        if isinstance(test, unittest.TestCase):
            self._failed_now = True
        else:
            # A setUpClass or setUpModule (or its tearDown) failed: it never
            # passes through startTest/stopTest, and its tests do not run.
            self.failed_ids.append(test.id())

    def addFailure(self, test, err):
        self._failed(test)
        super().addFailure(test, err)

    def addError(self, test, err):
        self._failed(test)
        super().addError(test, err)

    def addUnexpectedSuccess(self, test):
        self._failed_now = True
        super().addUnexpectedSuccess(test)

    def stopTest(self, test):
        super().stopTest(test)
        if self._failed_now:
            self.failed_ids.append(test.id())
        else:
            self.passed += 1


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    patterns = [a for a in argv if a != "-v"]
    sys.path.insert(0, str(HERE))
    import os
    for var, key in (("GRACEGUARD_HELM", "helm"), ("GRACEGUARD_HELM3", "helm3")):
        if not os.access(os.environ.get(var, ""), os.X_OK):
            print(f"error: {var} does not name a helm CLI; run through scripts/test, or export "
                  f"{var}=$(scripts/install-helm --json | jq -r .{key})", file=sys.stderr)
            print("0 passed, 1 failed")
            return 1
    try:
        import yaml  # noqa: F401
    except ImportError as e:
        print(f"error: cannot import yaml ({e}); run with the venv from scripts/helm-venv.sh "
              f"(source scripts/helm-venv.sh && \"$GRACEGUARD_PY\" {sys.argv[0]})", file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    loader = unittest.TestLoader()
    suite = loader.discover(str(HERE), pattern="test_*.py", top_level_dir=str(HERE))
    tests = [t for t in iter_tests(suite) if not patterns or any(p in t.id() for p in patterns)]
    # A module that failed to import shows up as a _FailedTest: it counts as a failure.
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2 if verbose else 1, resultclass=Result)
    start = time.monotonic()
    result = runner.run(unittest.TestSuite(tests))
    took = time.monotonic() - start
    failed = len(result.failed_ids)
    if result.skipped:
        # The chart tests never skip; a skip means a test was written wrong.
        for test, why in result.skipped:
            print(f"error: {test.id()} was skipped ({why}); the chart tests must not skip", file=sys.stderr)
        failed += len(result.skipped)
    for tid in result.failed_ids:
        print(f"FAILED {tid}", file=sys.stderr)
    if result.testsRun == 0:
        print("error: no chart test ran", file=sys.stderr)
        failed = max(failed, 1)
    print(f"chart tests took {took:.1f}s", file=sys.stderr)
    print(f"{result.passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
