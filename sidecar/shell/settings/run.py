"""`run`'s settings: the reading every command shares, then the daemon's sections, composed into one flat model
(the flags, the environment and the config file name each setting alone, as the contract documents). No I/O."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from sidecar.shell.settings.acting import ActingSection
from sidecar.shell.settings.declare import GENERAL, setting
from sidecar.shell.settings.derive import DeriveSection
from sidecar.shell.settings.exporter import ExporterSection
from sidecar.shell.settings.notify import NotifySection
from sidecar.shell.settings.policy import PolicySection
from sidecar.shell.settings.reading import ScrapeSettings


# pydantic takes the fields of the last base first: this order keeps the reading, the derivation, the policy, the
# adapter, the notifications and the server in that order within each help group.
class Settings(ExporterSection, NotifySection, ActingSection, PolicySection, DeriveSection, ScrapeSettings):
    """`run`: the daemon's settings."""

    state_dir: Path = setting(
        Path("/var/lib/vllm-sidecar"),
        "state kept across restarts",
        group=GENERAL,
        form="a directory path",
        why="state that must survive the sidecar's own restart (the restart ledger); checked at start (see above)",
    )
    dry_run: bool = setting(
        False,
        "act on nothing, only report",
        group=GENERAL,
        why="decide and report but act on nothing: readiness stays 200, no restart, the ledger is not written",
    )
    log_level: Literal["debug", "info", "warning", "error"] = setting(
        "info",
        "least severity logged",
        group=GENERAL,
    )
