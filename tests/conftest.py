"""Shared test helpers: where the recorded expositions live."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
EXPOSITIONS = FIXTURES / "expositions"


def exposition_files() -> list[Path]:
    return sorted(EXPOSITIONS.glob("*.prom"))
