"""Admin API authentication: off without a token, constant-time bearer check, token file changes."""

from __future__ import annotations

import os
from pathlib import Path

from sidecar.exporter.admin import AdminAuth

TOKEN = "s3cret-token-0123456789"  # noqa: S105 - a test fixture, not a secret


def test_no_token_file_means_the_api_is_off() -> None:
    result = AdminAuth(None).check(f"Bearer {TOKEN}")
    assert (result.allowed, result.status) == (False, 403)
    assert "admin API is off" in result.reason


def test_bearer_token_checks(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    auth = AdminAuth(path)
    assert auth.check(f"Bearer {TOKEN}").allowed
    assert auth.check(None).status == 401
    assert auth.check(f"Basic {TOKEN}").status == 401
    assert auth.check("Bearer wrong-token-0123456789").status == 403
    assert auth.check(f"Bearer {TOKEN}x").status == 403


def test_a_rotated_token_is_picked_up_and_a_bad_file_closes_the_api(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN)
    auth = AdminAuth(path)
    assert auth.check(f"Bearer {TOKEN}").allowed
    new = "another-token-9876543210"
    path.write_text(new)
    os.utime(path, (1_000_000_000, 1_000_000_001))  # a different mtime, as a Secret update gives
    assert auth.check(f"Bearer {new}").allowed
    assert not auth.check(f"Bearer {TOKEN}").allowed
    path.write_text("short")
    os.utime(path, (1_000_000_000, 1_000_000_002))
    result = auth.check("Bearer short")
    assert (result.allowed, result.status) == (False, 403)
    assert "shorter than 16" in result.reason
    path.unlink()
    assert "cannot read the token file" in auth.check(f"Bearer {new}").reason
