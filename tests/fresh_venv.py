"""Fresh virtual environments with flowengine installed as a user installs it.

A test session builds one wheelhouse (:func:`build_wheelhouse`): flowengine's wheel, built from
a copy of the source tree, and the wheels of every extra's dependencies, taken from pip's cache
(or the index, the first time). Each environment is then made in a second or two with pip's
``--no-index`` from that folder: what an install gets is exactly what ``setup.cfg`` declares,
since nothing else is in it to be picked up. Used by ``tests/install/`` (a venv per extra) and
``tests/test_getting_started.py`` (the page's own ``pip install -e .``); a plain module so both
can import it.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _user_extras() -> tuple[str, ...]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return tuple(name for name in parser["options.extras_require"] if name != "test")


#: The extras of setup.cfg a user installs on their own (``test`` is the developers'), read
#: from setup.cfg, so a new extra is tested on its own the day it is added.
EXTRAS = _user_extras()
#: Wheels the wheelhouse also holds: the OpenTelemetry SDK (an application of the ``otel``
#: extra brings its own) and what ``pip install -e .`` needs to build (pyproject.toml).
ALSO = ("opentelemetry-sdk", "setuptools>=61", "wheel")
#: Seconds one pip command may take (the wheelhouse's may download, the first time).
PIP_TIMEOUT = 600
#: Left out of the copy of the source tree: environments, caches and build leftovers.
NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                    "__pycache__", ".*_cache", "_build", "results")


def copy_source(dest: Path) -> Path:
    """A copy of the source tree, as a fresh clone has it, at ``dest``."""
    shutil.copytree(ROOT, dest, ignore=NOT_COPIED)
    return dest


def run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run a setup command; its output becomes the failure message if it fails."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=PIP_TIMEOUT,
                          stdin=subprocess.DEVNULL, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}:\n"
                           f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc  # type: ignore[no-any-return]


def build_wheelhouse(dest: Path) -> Path:
    """Build the wheelhouse in ``dest``; return the folder of wheels."""
    source = copy_source(dest / "source")
    wheels = dest / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(wheels),
         f"{source}[{','.join(EXTRAS)}]", *ALSO])
    return wheels


def pip_env(wheels: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) for pip commands that install from ``wheels`` only."""
    # Without PYTHONPATH: pip would take a source tree on it for an installed flowengine.
    return {**(clean_env() if env is None else env), "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": str(wheels), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def make_venv(path: Path, wheels: Path, *requirements: str) -> Path:
    """A fresh venv at ``path`` with ``requirements`` installed from ``wheels``; its python.

    The venv gets no pip of its own: this process's pip installs into it (``--python``), and
    skips compiling the installed files (imports compile what they use).
    """
    run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    python = path / "bin" / "python"
    # --ignore-installed: nothing outside the venv may stand in for what it must hold.
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile",
         "--ignore-installed", *requirements], env=pip_env(wheels))
    return python


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points Python or flowengine elsewhere."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("FLOWENGINE_")
           and key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra)
    return env
