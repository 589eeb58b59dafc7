"""The derived metrics' windows: `DeriveSettings` fields, their defaults and ranges the derivation's. No I/O."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

from sidecar.shell.settings.declare import derive_setting


class DeriveSection(BaseModel):
    """The windows the derivation computes its ratios, rates and memory trend over."""

    section: ClassVar[str] = "derive"  # its table in a config file

    window: float = derive_setting(
        "window_s",
        "window of hit ratios and rates",
        why="seconds of history for the prefix-cache hit ratio and rates",
    )
    memory_trend_window: float = derive_setting(
        "memory_trend_window_s",
        "window of the memory trend",
        why="seconds of history for the GPU memory growth trend",
    )
    min_trend_r2: float = derive_setting(
        "min_trend_r2",
        "least R² of a memory forecast",
        why="least R² of the memory trend before a time to OOM is forecast",
    )
