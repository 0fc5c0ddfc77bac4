"""`.ci/run` runs exactly the README's test command, and that command names each test file
as it runs (pytest's default progress lines; ``-q`` would print dots only)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_test_command() -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"Run the whole test suite:\s*```bash\n(.+?)\n```", text, re.S)
    assert block, "README.md lost its 'Run the whole test suite:' block"
    return block.group(1).strip()


def test_ci_runs_the_readmes_test_command():
    command = readme_test_command()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert ci_lines[-1] == command, f".ci/run ends with {ci_lines[-1]!r}, README says {command!r}"


def test_test_command_shows_each_file():
    args = shlex.split(readme_test_command())
    assert args[:3] == ["python", "-m", "pytest"], args
    quiet = [a for a in args if a in ("-q", "--quiet") or re.fullmatch(r"-q+", a)]
    assert not quiet, f"{quiet} hides the file names from the progress output"
