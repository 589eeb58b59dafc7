"""The demo's restart command, run by the sidecar's exec adapter (`--exec-command`). Does network I/O.

`python -m sidecar.demo.restart --url URL --token-file FILE` asks the demo that started the sidecar to stop its
simulated vLLM (SIGTERM) and start it again, with the reason the adapter passes in VLLM_SIDECAR_RESTART_REASON,
and waits for the answer: exit 0 and the demo's one line, or exit 1 and one line saying why not.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import httpx

TIMEOUT_S = 30.0  # the demo stops the simulator within 10 s, then starts a process


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sidecar.demo.restart", description="ask the running demo to restart its simulated vLLM"
    )
    parser.add_argument("--url", required=True, help="the demo's control endpoint (http://127.0.0.1:PORT/restart)")
    parser.add_argument("--token-file", required=True, type=Path, help="file holding the demo's control token")
    args = parser.parse_args(argv)
    try:
        token = args.token_file.read_text().strip()
    except OSError as error:
        print(f"cannot read the demo's token file {args.token_file}: {error.strerror or error}", file=sys.stderr)
        return 1
    reason = os.environ.get("VLLM_SIDECAR_RESTART_REASON", "")
    try:
        response = httpx.post(
            args.url, content=reason.encode(), headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT_S
        )
    except httpx.HTTPError as error:
        print(f"the demo did not answer at {args.url}: {type(error).__name__} {error}".rstrip(), file=sys.stderr)
        return 1
    line = response.text.strip().splitlines()[-1] if response.text.strip() else ""
    if response.status_code != httpx.codes.OK:
        print(f"the demo refused the restart (HTTP {response.status_code}): {line}", file=sys.stderr)
        return 1
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
