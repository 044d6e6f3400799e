"""How a test states a known defect: a strict xfail that only the defect's own failure satisfies.

A defect found before its fix gets its test first (see doc/testing.rst, "Known defects"). The
test is marked :func:`known_defect`: an expected failure, *strict*, so the day the defect is
fixed the test passes, the run fails (XPASS strict), and whoever fixed it removes the mark. The
mark accepts only :class:`DefectShown`, raised by the test's :func:`shown` block around the
check that sees the defect; anything else that goes wrong (a server missing, a worker that never
started, a harness error, a time limit) fails the test as usual instead of passing for the
defect.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest


class DefectShown(AssertionError):
    """The check of a :func:`shown` block failed: the defect is still there."""


def known_defect(reason: str) -> pytest.MarkDecorator:
    """Mark a test that fails because of the defect ``reason`` names (and for no other cause)."""
    return pytest.mark.xfail(strict=True, raises=DefectShown, reason=reason)


def intermittent_defect(reason: str) -> pytest.MarkDecorator:
    """Mark a test that *sometimes* fails because of the defect ``reason`` names: its runs
    that pass count as passes (the mark is not strict), its runs that fail count only when
    the failure is the defect's own (:class:`DefectShown`). For a defect not yet understood
    well enough to make it fail every time; the reason says how often it was seen."""
    return pytest.mark.xfail(strict=False, raises=DefectShown, reason=reason)


@contextlib.contextmanager
def shown() -> Iterator[None]:
    """The checks that see the defect: an ``AssertionError`` inside becomes :class:`DefectShown`."""
    try:
        yield
    except DefectShown:
        raise
    except AssertionError as err:
        raise DefectShown(str(err)) from err
