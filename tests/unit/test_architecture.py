"""The import contracts are the architecture (docs/architecture.md): every part of the package sits in a layer,
and `lint-imports` refuses an import that crosses the layers, shown here on a copy of the tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def _contracts() -> list[dict[str, object]]:
    contracts: list[dict[str, object]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
    return contracts


def _layered() -> list[str]:
    (layers,) = (contract for contract in _contracts() if contract["type"] == "layers")
    assert "ignore_imports" not in layers  # an exception is a layer that is not where the picture says
    found = []
    for layer in layers["layers"]:  # type: ignore[attr-defined]  # a TOML list of strings
        found += [name.strip() for name in str(layer).replace(":", "|").split("|")]
    return found


def test_every_package_and_module_of_the_sidecar_is_in_exactly_one_layer() -> None:
    parts = {
        f"sidecar.{path.stem if path.is_file() else path.name}"
        for path in (ROOT / "sidecar").iterdir()
        if (path.is_file() and path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
    }
    layered = _layered()
    assert sorted(layered) == sorted(set(layered))  # none twice
    assert set(layered) == parts


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what lint-imports reads: the packages and pyproject.toml."""
    copy = tmp_path_factory.mktemp("tree")
    for package in ("sidecar", "vllm_sidecar_probe"):
        shutil.copytree(ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"]
    return subprocess.run(command, cwd=tree, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # The example: the policy reaching a webhook sender (and through it httpx), even indirectly.
        ("sidecar/policy/rules.py", "import sidecar.notify.webhook", "The pure core"),
        ("sidecar/parse/vllm.py", "import sidecar.shell.daemon", "The pure core"),
        # Adapters are siblings: a source may not reach for a restart adapter.
        ("sidecar/sources/fetch.py", "import sidecar.actuators.systemd", "Layers"),
        # The settings machinery is below the shell.
        ("sidecar/config/settings_cli.py", "import sidecar.shell.settings", "Layers"),
    ],
)
def test_lint_imports_refuses_an_import_across_the_layers(tree: Path, module: str, line: str, broken: str) -> None:
    path = tree / module
    original = path.read_text()
    path.write_text(original + f"\n{line}  # noqa\n")
    try:
        done = _lint_imports(tree)
    finally:
        path.write_text(original)
    assert done.returncode == 1, done.stdout[-2000:]
    _, said = done.stdout.split("Broken contracts", 1)
    assert f"\n{broken}" in said, said[:2000]
    assert line.rsplit(maxsplit=1)[-1] in said  # the path names the import that crossed


def test_the_tree_as_it_is_keeps_every_contract(tree: Path) -> None:
    done = _lint_imports(tree)
    assert done.returncode == 0, done.stdout[-3000:]
