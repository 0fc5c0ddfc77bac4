"""The habits hold without anyone watching: ruff (style, imports, likely bugs) and the
import-linter layer contracts in pyproject.toml pass on the whole repository."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    """The console script installed beside this interpreter (requirements-dev.txt installs both)."""
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    assert found, f"{name} is not installed: pip install -r requirements-dev.txt"
    return found


def test_ruff_passes() -> None:
    res = subprocess.run([_tool("ruff"), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_import_layers_hold() -> None:
    res = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout or "broken" not in res.stdout.lower(), res.stdout


def test_layer_contract_catches_an_upward_import(tmp_path: Path) -> None:
    """The contract is live: a copy of the configuration with the runner importing the
    engine (an upward import) is reported broken."""
    pkg = tmp_path / "core_runner"
    for sub in ("engine", "runner"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "runner" / "bad.py").write_text("import core_runner.engine\n")
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = core_runner\n\n[importlinter:contract:1]\nname = layers\ntype = layers\n"
        "layers =\n    core_runner.engine\n    core_runner.runner\n"
    )
    res = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path), "PATH": str(Path(sys.executable).parent)})
    assert res.returncode != 0 and "core_runner.runner.bad -> core_runner.engine" in res.stdout, res.stdout
