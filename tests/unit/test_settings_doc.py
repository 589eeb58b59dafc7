"""docs/settings.md's table of every setting is what the settings' fields say (`sidecar.shell.settings_doc`)."""

from __future__ import annotations

from sidecar.shell.settings import OnceSettings, Settings
from sidecar.shell.settings_doc import PAGE, main, rewritten, table


def test_the_page_is_what_the_fields_write() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert rewritten(page) == page, "docs/settings.md is out of date: run python -m sidecar.shell.settings_doc"
    assert main(["--check"]) == 0


def test_every_setting_has_a_row_with_what_it_accepts() -> None:
    generated = table()
    for name in Settings.model_fields:
        row = next(line for line in generated.splitlines() if line.startswith(f"| `--{name.replace('_', '-')}` |"))
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert len(cells) == 5, row
        assert cells[4], f"--{name} has no meaning"
        if Settings.model_fields[name].annotation in (int, float):
            assert cells[3], f"--{name} does not say what it accepts"
    assert "`--json` (print the JSON document)" in generated  # once's own
    assert set(OnceSettings.model_fields) - {"json"} <= set(Settings.model_fields)


def test_a_range_is_written_once_and_read_everywhere() -> None:
    """The policy's range for --pause-kv-usage is on `PolicySettings`' field: the flag, the help's page and the
    error line all read it from there."""
    row = next(line for line in table().splitlines() if line.startswith("| `--pause-kv-usage` |"))
    assert "a ratio, > 0 and <= 1; above --resume-kv-usage" in row
    assert Settings.model_fields["max_restarts_per_hour"].metadata  # Ge(0), Le(60) copied from the policy
