"""The admin token is compared in constant time, whatever is presented.

A timing measurement on a shared CI machine cannot tell microseconds apart reliably, so the property is
checked structurally: every presented bearer token, of any length and however early it differs, reaches
`hmac.compare_digest` with the configured token, and nothing compares them before it (a `==` or a length
check first would answer sooner for a wrong length or a wrong first byte, and never reach the spy).
"""

from __future__ import annotations

import hmac
from pathlib import Path

import pytest

from sidecar.exporter.admin import AdminAuth

TOKEN = "constant-time-admin-token-0123456789"  # noqa: S105 - a test fixture, not a secret


@pytest.mark.parametrize(
    "presented",
    [
        TOKEN,  # right
        "x" + TOKEN[1:],  # wrong in the first byte
        TOKEN[:-1] + "x",  # wrong in the last byte
        TOKEN[:5],  # a prefix: shorter
        TOKEN + "0" * 100,  # longer
        "",  # empty after the scheme
    ],
)
def test_every_presented_token_goes_through_compare_digest(
    presented: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)  # the module admin.py calls it through
    result = AdminAuth(path).check(f"Bearer {presented}")
    assert calls == [(presented.encode(), TOKEN.encode())]
    assert result.allowed is (presented == TOKEN)
    assert result.status == (200 if presented == TOKEN else 403)
