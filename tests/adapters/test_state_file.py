"""The state file: atomic replacement, and a corrupt file moved aside with a clear problem."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sidecar.shell.state_file import StateFile


def test_round_trip_and_missing_file(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "sub" / "ledger.json")
    assert state.load().document is None
    assert state.load().problem is None
    state.save({"restarts": [{"wall_time_s": 1.5, "reason": "engine_hung"}]})
    assert state.load().document == {"restarts": [{"wall_time_s": 1.5, "reason": "engine_hung"}]}
    state.save({"restarts": []})
    assert state.load().document == {"restarts": []}
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["ledger.json"]  # no temporary left


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"\xff\xfe", b"x" * (1024 * 1024 + 1)])
def test_a_corrupt_file_is_moved_aside(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "ledger.json"
    path.write_bytes(content)
    loaded = StateFile(path).load()
    assert loaded.document is None
    assert loaded.problem is not None
    assert "moved aside to ledger.json.corrupt-" in loaded.problem
    assert not path.exists()
    assert len(list(tmp_path.glob("ledger.json.corrupt-*"))) == 1


def test_a_failed_write_keeps_the_old_document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = StateFile(tmp_path / "ledger.json")
    state.save({"version": 1})

    def broken_replace(source: str, target: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space left"):
        state.save({"version": 2})
    monkeypatch.undo()
    assert json.loads((tmp_path / "ledger.json").read_text()) == {"version": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]
