"""Authentication of the admin API (`POST /admin/pause|resume|restart`). Reads the token file.

No token configured means the admin API is off (every call 403). A configured token is compared in
constant time; the token file is re-read when it changes (Kubernetes Secrets are updated in place), and a
token that cannot be read disables the API rather than opening it.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

from sidecar.file_cap import read_capped_file

MAX_TOKEN_BYTES = 4096
MIN_TOKEN_CHARS = 16  # shorter is guessable; refuse to run the API with it


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthResult:
    allowed: bool
    status: int  # 200 when allowed, else 401 (no or malformed credentials) or 403 (wrong token or API off)
    reason: str


class AdminAuth:
    def __init__(self, token_file: Path | None) -> None:
        self._path = token_file
        self._cached: tuple[float, int, bytes | None, str] | None = None  # mtime, size, token, problem

    def _token(self) -> tuple[bytes | None, str]:
        if self._path is None:
            return None, "the admin API is off: no --admin-token-file is configured"
        try:
            stat = os.stat(self._path)
        except OSError as error:
            return None, f"the admin API is off: cannot read the token file ({error.strerror or error})"
        if self._cached is not None and self._cached[:2] == (stat.st_mtime, stat.st_size):
            return self._cached[2], self._cached[3]
        token, problem = _read_token(self._path, stat.st_size)
        self._cached = (stat.st_mtime, stat.st_size, token, problem)
        return token, problem

    def check(self, authorization: str | None) -> AuthResult:
        token, problem = self._token()
        if token is None:
            return AuthResult(allowed=False, status=HTTPStatus.FORBIDDEN, reason=problem)
        # The scheme is case-insensitive (RFC 9110 11.1); then 1*SP and the token (RFC 6750).
        if authorization is None or authorization[:7].lower() != "bearer ":
            return AuthResult(allowed=False, status=HTTPStatus.UNAUTHORIZED, reason="a bearer token is required")
        try:
            # The server decoded the header as latin-1: encoding it back gives the very bytes the client sent,
            # which is how a token with non-ASCII characters (UTF-8 in the file) matches.
            presented = authorization[7:].strip(" \t").encode("latin-1")
        except UnicodeEncodeError:  # not from an HTTP header: cannot be the token's bytes
            return AuthResult(allowed=False, status=HTTPStatus.FORBIDDEN, reason="wrong token")
        if not hmac.compare_digest(presented, token):
            return AuthResult(allowed=False, status=HTTPStatus.FORBIDDEN, reason="wrong token")
        return AuthResult(allowed=True, status=HTTPStatus.OK, reason="ok")


def _read_token(path: Path, size: int) -> tuple[bytes | None, str]:
    if size > MAX_TOKEN_BYTES:
        return None, f"the admin API is off: the token file is over {MAX_TOKEN_BYTES} bytes"
    try:
        # Capped again here: the size from stat says nothing for a FIFO or a device, and the file may grow.
        token = read_capped_file(path, MAX_TOKEN_BYTES).strip()
    except OSError as error:
        return None, f"the admin API is off: cannot read the token file ({error.strerror or error})"
    if len(token) < MIN_TOKEN_CHARS:
        return None, f"the admin API is off: the token is shorter than {MIN_TOKEN_CHARS} characters"
    return token, ""
