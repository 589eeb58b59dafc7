"""Points every file the sidecar reads at /dev/zero (size 0, endless content) and says what each reader did.

Run as `python -m tests.security.dev_zero FOLDER` by `test_limits.py`, under an address-space limit: a reader
that trusts the size or reads to the end would take all memory, so it runs in its own process, where that
ends in a MemoryError reported as that case's outcome instead of in the test process's death.
"""

from __future__ import annotations

import json
import re
import resource
import sys
from collections.abc import Callable
from pathlib import Path

ADDRESS_SPACE_BYTES = 2 * 2**30


def _cases(folder: Path) -> dict[str, Callable[[], object]]:
    from sidecar.actuators.kube_credentials import kubeconfig_credentials
    from sidecar.doctor_cli import gather
    from sidecar.exporter.admin import AdminAuth
    from sidecar.exporter.tls import server_context
    from sidecar.shell.acting_setup import read_api_key, read_secret_file
    from sidecar.shell.settings import Settings, read_config_file
    from sidecar.shell.state_file import StateFile
    from sidecar.sources.proc import identify_process

    def link(name: str) -> Path:
        path = folder / name
        path.symlink_to("/dev/zero")
        return path

    def kube_token() -> object:
        """lightkube reads a token file whole at the first request: the file is read with a cap before that."""
        config = {
            "current-context": "c",
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": {"tokenFile": str(link("token"))}}],
        }
        (folder / "token-kubeconfig").write_text(json.dumps(config))
        return kubeconfig_credentials(folder / "token-kubeconfig")

    def proc() -> object:
        (folder / "proc" / "1").mkdir(parents=True)
        for name in ("comm", "cmdline"):
            (folder / "proc" / "1" / name).symlink_to("/dev/zero")
        return identify_process(1, proc_root=folder / "proc", pattern=re.compile("vllm"))

    gather.MAX_LOG_BYTES = 2**20  # the doctor reads the tail of a log, 64 MiB of it: 1 MiB shows the bound as well
    return {
        "config file": lambda: read_config_file(link("c.toml"), set(Settings.model_fields)),
        "admin token file": lambda: AdminAuth(link("admin-token")).check("Bearer x").reason,
        "webhook HMAC key file": lambda: read_secret_file(link("hmac"), "--webhook-hmac-key-file"),
        "vLLM API key file": lambda: read_api_key(link("vllm-api-key")),
        "kubeconfig": lambda: kubeconfig_credentials(link("kubeconfig")),
        "kubernetes token file": kube_token,
        "state file": lambda: StateFile(link("restart-ledger.json")).load().problem,
        "doctor --vllm-log": lambda: type(gather.read_log(Path("/dev/zero"))).__name__,
        "/proc comm and cmdline": proc,
        "TLS certificate": lambda: server_context(link("tls.crt"), link("tls.key")),
    }


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))
    folder = Path(sys.argv[1])
    for case, read in _cases(folder).items():
        try:
            outcome = f"returned {read()!r}"[:300]
        except MemoryError:
            outcome = "MemoryError"
        except Exception as error:  # every other outcome is reported, for the test to judge
            outcome = f"{type(error).__name__}: {error}"[:300]
        print(json.dumps({"case": case, "outcome": outcome}), flush=True)


if __name__ == "__main__":
    main()
