"""The doctor's pure core is exactly what the import-linter contract checks: a new module cannot slip past it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
SHELL = {"sidecar.doctor.gather", "sidecar.doctor.command"}


def test_every_module_of_the_doctor_but_its_shell_is_in_the_pure_core_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    pure = next(contract for contract in contracts if contract["name"].startswith("The pure core"))
    modules = {
        f"sidecar.doctor.{path.stem}" for path in (ROOT / "sidecar" / "doctor").glob("*.py") if path.stem != "__init__"
    }
    assert modules - SHELL == {name for name in pure["source_modules"] if name.startswith("sidecar.doctor.")}
    assert set(pure["forbidden_modules"]) >= SHELL
