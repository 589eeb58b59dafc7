"""TLS for the daemon's own listener: a server context from PEM files, re-read when they change. Reads files.

TLS 1.2 or later, no compression, no renegotiation; on TLS 1.2 only forward-secret AEAD suites (Mozilla's
"intermediate" list: Python's default also allows CBC ones), on TLS 1.3 OpenSSL's, which all are. The
certificate and key are read at start, where a bad pair is a one-line `TlsError` (exit 2).

cert-manager and the kubelet rotate a Secret's files in place (an atomic swap of a symlinked folder), so the
files are checked again at most once per `check_interval_s`, on a handshake: two `stat` calls. When they
changed, the pair is loaded into a fresh context and new connections are handed to it from the SNI callback,
which OpenSSL runs on every ClientHello, with a server name or without. Connections already open keep the
certificate they started with. A pair that does not load (a rotation half written, a key that does not
match) keeps the previous certificate serving and is reported once, until the files change again.
"""

from __future__ import annotations

import os
import ssl
import stat
import time
from collections.abc import Callable
from pathlib import Path

from structlog.typing import FilteringBoundLogger

from sidecar.file_cap import read_capped_file

MAX_PEM_BYTES = 1024 * 1024  # a chain of a few certificates is a few KiB; this is not one
CHECK_INTERVAL_S = 5.0
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20:!aNULL"

_FileIdentity = tuple[int, int, int, int]  # device, inode, mtime_ns, size


class TlsError(Exception):
    """The certificate or key cannot be used; the message is one line naming the files and the reason."""


def server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A server context serving `cert_file` (PEM chain, leaf first) with `key_file` (unencrypted PEM key)."""
    _check_file(cert_file, "--tls-cert-file", b"-----BEGIN CERTIFICATE-----", "PEM certificate")
    _check_file(key_file, "--tls-key-file", b"PRIVATE KEY-----", "PEM private key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.set_ciphers(TLS12_CIPHERS)
    context.set_alpn_protocols(["http/1.1"])
    try:
        # A password callback that gives nothing: an encrypted key fails here instead of OpenSSL prompting
        # on a terminal the daemon does not have.
        context.load_cert_chain(cert_file, key_file, password=_no_password)
    except ssl.SSLError as error:
        raise TlsError(
            f"cannot use --tls-cert-file {cert_file} with --tls-key-file {key_file}: {_ssl_reason(error)} "
            "(PEM certificate chain, and its unencrypted PEM private key)"
        ) from None
    except OSError as error:
        raise TlsError(f"cannot read --tls-cert-file {cert_file} or --tls-key-file {key_file}: {error}") from None
    return context


class ReloadingServerTls:
    """The listener's context (`listener`), and the newest context that loaded, handed to new connections."""

    def __init__(
        self,
        cert_file: Path,
        key_file: Path,
        *,
        logger: FilteringBoundLogger | None = None,
        check_interval_s: float = CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cert_file = cert_file
        self._key_file = key_file
        self._log = logger
        self._check_interval_s = check_interval_s
        self._clock = clock
        self._seen = self._identity()
        self.listener = server_context(cert_file, key_file)  # raises TlsError: the daemon stops at start
        self.listener.sni_callback = self._on_client_hello
        self._current = self.listener
        self._checked_s = clock()
        self.reloads_total = 0

    def _on_client_hello(self, connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: object) -> None:
        try:
            self._maybe_reload()
            if connection.context is not self._current:
                connection.context = self._current
        except Exception as error:  # noqa: BLE001 - raising here fails the handshake; serve the old cert instead
            if self._log is not None:
                self._log.error("tls_reload_failed", error=f"{type(error).__name__}: {error}")

    def _maybe_reload(self) -> None:
        now_s = self._clock()
        if now_s - self._checked_s < self._check_interval_s:
            return
        self._checked_s = now_s
        identity = self._identity()
        if identity == self._seen:
            return
        self._seen = identity  # a pair that fails is reported once, and tried again only when it changes
        try:
            context = server_context(self._cert_file, self._key_file)
        except TlsError as error:
            if self._log is not None:
                self._log.error("tls_reload_failed", error=str(error), kept="the previous certificate")
            return
        self._current = context
        self.reloads_total += 1
        if self._log is not None:
            self._log.info("tls_reloaded", cert_file=str(self._cert_file), key_file=str(self._key_file))

    def _identity(self) -> tuple[_FileIdentity | None, ...]:
        identities: list[_FileIdentity | None] = []
        for path in (self._cert_file, self._key_file):
            try:
                info = os.stat(path)
            except OSError:
                identities.append(None)
            else:
                identities.append((info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size))
        return tuple(identities)


def _check_file(path: Path, flag: str, marker: bytes, what: str) -> None:
    """A regular file of sane size holding `marker`: OpenSSL reads whatever it is given (/dev/zero included)
    and says only "PEM lib" about most of what is wrong, so the usual mistakes are named here first."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise TlsError(f"{flag} {path} is not a regular file")
        data = read_capped_file(path, MAX_PEM_BYTES)
    except OSError as error:
        raise TlsError(f"cannot read {flag} {path}: {error.strerror or error}") from None
    if b"ENCRYPTED" in data:
        raise TlsError(f"{flag} {path} is an encrypted key: give it unencrypted (no one is there to type a passphrase)")
    if marker not in data:
        raise TlsError(f"{flag} {path} holds no {what}")


def _no_password() -> bytes:
    return b""


def _ssl_reason(error: ssl.SSLError) -> str:
    text = " ".join(str(error).split())
    cut = text.find(" (_ssl.c:")
    return text[:cut] if cut > 0 else text
