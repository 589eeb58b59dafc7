"""The systemd actuator where real systemd cannot go: unit-name rules, dry-run, no bus, and scripted answers
(polkit refusals, a job that ends before RestartUnit answers, a bus that dies) from a stand-in on a real bus."""

from __future__ import annotations

import string
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.actuators.base import OutcomeStatus
from sidecar.actuators.systemd import SystemdActuator
from sidecar.actuators.unit_name import validate_unit_name

from .fake_systemd import FakeSystemd, dbus_daemon_missing

UNIT_CHARS = set(string.ascii_letters + string.digits + ":_.-@\\")


@pytest.mark.parametrize(
    ("unit", "rule"),
    [
        ("../x.service", "contains a path separator '/'"),
        ("/etc/systemd/system/x.service", "contains a path separator '/'"),
        ("x", "does not end in '.service'"),
        ("x.socket", "does not end in '.service'"),
        ("x.service;rm", "contains ';'"),
        ("x.service; rm -rf ~", "contains ';'"),
        ("a b.service", "contains ' '"),
        ("x.service\n", "contains '\\n'"),
        ("x\x00.service", "contains '\\x00'"),
        ("vllm$(id).service", "contains '$'"),
        ("vllm\u00e9.service", "contains '\u00e9'"),
        ("-x.service", "starts with '-'"),
        ("--user.service", "starts with '-'"),
        ("a" * 300, "is 300 characters long; systemd allows at most 255"),
        ("a" * 248 + ".service", "is 256 characters long"),
        ("", "is empty"),
        (".service", "has nothing before '.service'"),
        ("@x.service", "starts with '@'"),
        ("vllm@.service", "is a template with no instance"),
    ],
)
def test_a_bad_unit_name_is_refused_naming_the_rule(unit: str, rule: str) -> None:
    with pytest.raises(ValueError, match="systemd unit name") as refused:
        SystemdActuator(unit)
    assert rule in str(refused.value)
    assert "\n" not in str(refused.value).replace("\\n", "")


@pytest.mark.parametrize(
    "unit",
    [
        "vllm.service",
        "vllm@0.service",
        "vllm@gpu@0.service",
        "vllm-gpu_0:a.service",
        "a\\x2db.service",
        "a" * 247 + ".service",
    ],
)
def test_a_good_unit_name_is_kept_as_is(unit: str) -> None:
    assert SystemdActuator(unit).unit == unit


@given(st.text(max_size=300))
def test_whatever_passes_is_one_service_in_systemd_charset(unit: str) -> None:
    try:
        accepted = validate_unit_name(unit)
    except ValueError:
        return
    assert accepted == unit
    assert set(unit) <= UNIT_CHARS
    assert unit.endswith(".service")
    assert 9 <= len(unit) <= 255
    assert not unit.startswith(("-", "@"))


@given(st.text(alphabet=sorted(UNIT_CHARS), min_size=1, max_size=40))
def test_every_plain_name_in_the_charset_passes(stem: str) -> None:
    if stem.startswith(("-", "@")) or stem.endswith("@"):
        return
    assert validate_unit_name(stem + ".service") == stem + ".service"


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="bus must be 'system' or 'user'"):
        SystemdActuator("vllm.service", bus="session")  # type: ignore[arg-type]
    for timeout_s in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="job timeout must be a positive number"):
            SystemdActuator("vllm.service", job_timeout_s=timeout_s)


async def test_dry_run_says_what_it_would_call() -> None:
    outcome = await SystemdActuator("vllm.service").restart(reason="x", dry_run=True)

    assert outcome.status is OutcomeStatus.DRY_RUN
    assert outcome.detail == "would call RestartUnit(vllm.service, replace) on the system bus"


async def test_no_bus_is_a_failure_with_a_clear_line(tmp_path: Path) -> None:
    address = f"unix:path={tmp_path / 'no-bus'}"
    outcome = await SystemdActuator("vllm.service", bus_address=address).restart(reason="x", dry_run=False)

    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.detail == f"cannot reach the system bus ({address}): [Errno 2] No such file or directory"


async def test_no_session_bus_address_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    outcome = await SystemdActuator("vllm.service", bus="user").restart(reason="x", dry_run=False)

    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.detail == "cannot reach the user bus (SESSION): DBUS_SESSION_BUS_ADDRESS is not set"


@pytest.fixture
def fake_systemd(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[FakeSystemd]:
    missing = dbus_daemon_missing()
    if missing is not None:
        pytest.skip(missing)
    behaviour, error_name, job_result = request.param
    fake = FakeSystemd(tmp_path, behaviour, error_name=error_name, job_result=job_result)
    try:
        yield fake
    finally:
        fake.close()


@pytest.mark.parametrize(
    ("fake_systemd", "detail"),
    [
        (
            ("error", "org.freedesktop.DBus.Error.AccessDenied", ""),
            "not allowed to restart vllm.service on the system bus (org.freedesktop.DBus.Error.AccessDenied: "
            "scripted refusal); run as root or grant polkit action org.freedesktop.systemd1.manage-units to the "
            "sidecar's user",
        ),
        (
            ("error", "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired", ""),
            "not allowed to restart vllm.service on the system bus "
            "(org.freedesktop.DBus.Error.InteractiveAuthorizationRequired: scripted refusal)",
        ),
        (
            ("error", "org.freedesktop.systemd1.UnitMasked", ""),
            "systemd refused for vllm.service: org.freedesktop.systemd1.UnitMasked: scripted refusal",
        ),
        (("job_removed_before_reply", "", "dependency"), "ended with job result: dependency"),
        (("bus_dies", "", ""), "lost the system bus (connection closed while waiting for a signal)"),
    ],
    indirect=["fake_systemd"],
)
async def test_scripted_refusals_and_failures(fake_systemd: FakeSystemd, detail: str) -> None:
    actuator = SystemdActuator("vllm.service", bus_address=fake_systemd.address, job_timeout_s=5)

    outcome = await actuator.restart(reason="x", dry_run=False)

    assert outcome.status is OutcomeStatus.FAILED
    assert detail in outcome.detail
    assert outcome.duration_s < 2


@pytest.mark.parametrize("fake_systemd", [("job_removed_before_reply", "", "done")], indirect=True)
async def test_a_job_that_ends_before_the_answer_arrives_is_not_missed(fake_systemd: FakeSystemd) -> None:
    actuator = SystemdActuator("vllm.service", bus_address=fake_systemd.address, job_timeout_s=5)

    outcome = await actuator.restart(reason="x", dry_run=False)

    assert outcome.status is OutcomeStatus.DONE, outcome.detail
    assert fake_systemd.calls == ["Subscribe", "RestartUnit"]


@pytest.mark.parametrize("fake_systemd", [("no_job_removed", "", "")], indirect=True)
async def test_no_job_removed_is_bounded_by_the_job_timeout(fake_systemd: FakeSystemd) -> None:
    actuator = SystemdActuator("vllm.service", bus_address=fake_systemd.address, job_timeout_s=0.3)

    outcome = await actuator.restart(reason="x", dry_run=False)

    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.detail.startswith("timed out after 0.3 s: restart job /org/freedesktop/systemd1/job/7")
    assert 0.3 <= outcome.duration_s < 1.0
