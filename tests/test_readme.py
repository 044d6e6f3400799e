"""The README's quick example runs as shown, and prints what its comments say."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _quick_example() -> str:
    section = README.read_text().split("## Quick example", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, "the README's quick example has no python block"
    return found.group(1)


def test_the_quick_example_prints_what_its_comment_says(tmp_path: pathlib.Path) -> None:
    code = _quick_example()
    promised = re.findall(r"#\s*(reserved \w+)\s*$", code, re.MULTILINE)
    assert promised, "the example's last line no longer says what it prints"
    script = tmp_path / "quick.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # Nothing failed, so the revert did not run: the one line is the booking.
    assert proc.stdout.splitlines() == promised
