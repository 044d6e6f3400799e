"""A known defect's strict xfail accepts the defect's own failure, and nothing else."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TESTS = '''
from known_defects import known_defect, shown

@known_defect("the defect")
def test_fails_for_the_defect():
    with shown():
        assert 1 == 2, "the defect shows"

@known_defect("the defect")
def test_fails_for_another_cause():
    assert 1 == 2, "the setup went wrong"
    with shown():
        assert True

@known_defect("the defect")
def test_the_defect_is_fixed():
    with shown():
        assert True
'''


def test_only_the_defect_itself_is_an_expected_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_marked=TESTS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rxXf")
    result.assert_outcomes(xfailed=1, failed=2)
    result.stdout.fnmatch_lines([
        "XFAIL *test_fails_for_the_defect - the defect",
        "FAILED *test_fails_for_another_cause - AssertionError: the setup went wrong*",
        "FAILED *test_the_defect_is_fixed*",
    ])
