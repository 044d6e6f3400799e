"""An innocent-looking module that re-exports standard library functions (see hostile_records)."""

from os import system  # noqa: F401 - re-exported on purpose
from subprocess import call  # noqa: F401 - re-exported on purpose
