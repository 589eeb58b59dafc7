"""Certificates for the TLS tests, made by the `openssl` command line: a throwaway CA and leaves it signs.

Each call writes PEM files into a folder of the test's own; nothing is shared between tests. EC P-256 keys,
so making one costs milliseconds. The leaf carries the subjectAltNames Go (Prometheus) and Python verify
against: IP 127.0.0.1 and DNS localhost.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl_missing() -> str | None:
    return None if shutil.which("openssl") else "the openssl command is not installed"


@dataclass(frozen=True, slots=True, kw_only=True)
class Pair:
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


def make_ca(folder: Path, name: str = "vllm-sidecar test CA") -> Pair:
    folder.mkdir(parents=True, exist_ok=True)
    pair = Pair(cert=folder / "ca.crt", key=folder / "ca.key")
    _openssl(
        "req", "-x509", *_EC, "-keyout", str(pair.key), "-out", str(pair.cert), "-days", "2", "-subj", f"/CN={name}"
    )
    return pair


def issue(ca: Pair, folder: Path, common_name: str) -> Pair:
    """A server certificate for 127.0.0.1 and localhost, signed by `ca`."""
    folder.mkdir(parents=True, exist_ok=True)
    pair = Pair(cert=folder / f"{common_name}.crt", key=folder / f"{common_name}.key")
    request = folder / f"{common_name}.csr"
    extensions = folder / f"{common_name}.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _openssl("req", *_EC, "-keyout", str(pair.key), "-out", str(request), "-subj", f"/CN={common_name}")
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca.cert), "-CAkey", str(ca.key), "-set_serial", "1",
        "-out", str(pair.cert), "-days", "2", "-extfile", str(extensions),
    )  # fmt: skip
    return pair


def client_context(*cas: Pair) -> ssl.SSLContext:
    """What a careful client does: verify the chain against `cas` and the name against the address."""
    context = ssl.create_default_context()
    for ca in cas:
        context.load_verify_locations(cafile=str(ca.cert))
    return context


def served_common_name(peercert: object) -> str:
    """The subject CN of the certificate a server presented (`getpeercert()` form)."""
    assert isinstance(peercert, dict)
    for rdn in peercert["subject"]:
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    raise AssertionError(f"no commonName in {peercert}")
