"""Runs `vllm-sidecar doctor` as a real subprocess and hands back its exit code, JSON document and stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

DOCTOR_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class DoctorRun:
    code: int
    document: dict[str, Any] | None  # None without --json or when nothing was printed
    stdout: str
    stderr: str


def clean_env() -> dict[str, str]:
    """Our environment without VLLM_SIDECAR_* settings, which would reach the doctor's options."""
    return {key: value for key, value in os.environ.items() if not key.startswith("VLLM_SIDECAR_")}


def start_doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sidecar", "doctor", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env() if env is None else env,
    )


def finish(process: subprocess.Popen[str]) -> DoctorRun:
    try:
        stdout, stderr = process.communicate(timeout=DOCTOR_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()  # our own child, by its handle
        process.communicate()
        raise
    document: dict[str, Any] | None = None
    if stdout.lstrip().startswith("{"):
        document = json.loads(stdout)
    return DoctorRun(code=process.returncode, document=document, stdout=stdout, stderr=stderr)


def run_doctor(*args: str, env: dict[str, str] | None = None) -> DoctorRun:
    return finish(start_doctor(*args, env=env))


def summary(document: dict[str, Any]) -> list[tuple[str, str, tuple[tuple[str, Any], ...]]]:
    """(cause, severity, ((flag, value), ...)) per finding, in the document's order."""
    return [
        (
            finding["cause"],
            finding["severity"],
            tuple((r["flag"], r["value"]) for r in finding["recommendations"]),
        )
        for finding in document["findings"]
    ]
