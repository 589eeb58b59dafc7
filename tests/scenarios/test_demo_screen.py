"""The demo's screen without the demo: what each event reads, both outcomes, the problems line beside the
policy's state, and a frame fitted to 80x24, 120x40 and a tiny terminal, newest event and decision kept."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from sidecar.demo.compact import decision, problem_lines, problems
from sidecar.demo.events import EventLog, SidecarStory, logged_at_s, sidecar_line
from sidecar.demo.outcome import Side, crash_name, side_lines
from sidecar.demo.screen import Frame, screen
from sidecar.demo.view import Header

GIB = 2**30
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 114.07 MiB. GPU 0 has a total capacity of 80 GiB"


def test_each_step_of_the_story_reads_as_one_line() -> None:
    assert sidecar_line({"event": "probe_sent", "kind": "probe", "reason": "engine 0 made no progress"}) == (
        "sidecar sends the engine probe (a 1-token completion): engine 0 made no progress"
    )
    answer = {"event": "probe_no_answer", "detail": "no answer within 10 s", "duration_s": 10.04}
    assert sidecar_line(answer) == "sidecar's probe: no answer after 10.04 s: no answer within 10 s"
    blocked = {"event": "restart_blocked", "restart": "oom_forecast", "detail": "vLLM up only 33 s < 40 s"}
    assert sidecar_line(blocked) == "sidecar would restart (oom_forecast), but vLLM up only 33 s < 40 s"
    drain = {
        "event": "action",
        "action": "drain",
        "reason": "restart (engine_hung) begins: x; admission paused, no drain",
    }
    line = sidecar_line(drain)
    assert line is not None
    assert "drain:" not in line, "no 'no drain' inside a drain line"
    assert sidecar_line({"event": "tick"}) is None
    done = {"event": "restart_outcome", "adapter": "exec", "status": "done", "duration_s": 0.4, "detail": "x"}
    assert sidecar_line(done) == "sidecar: restart adapter (exec) done after 0.4 s"


def test_a_reason_is_told_once() -> None:
    story = SidecarStory()
    why = "drained: 0 requests running; restarting vLLM (oom_forecast)"
    state = {"event": "policy_state", "previous": "draining", "state": "restarting", "reason": why}
    assert story.line(state) == f"sidecar policy: draining -> restarting: {why}"
    assert story.line({"event": "action", "action": "restart", "reason": why}) == "sidecar decides: restart"
    other = {"event": "action", "action": "pause_admission", "reason": "GPU free memory 4.8 %"}
    assert story.line(other) == "sidecar decides: pause_admission: GPU free memory 4.8 %"


def test_events_keep_their_order_and_the_sidecars_time() -> None:
    assert logged_at_s({"timestamp": "2030-01-01T00:00:10Z"}, 1_893_456_000.0) == pytest.approx(10.0)
    assert logged_at_s({"timestamp": "yesterday"}, 0.0) is None
    log = EventLog()
    log.add(12.4, "the demo's line")
    log.add(11.9, "a sidecar line read a moment later")
    assert log.lines == ["   12 s  the demo's line", "   12 s  a sidecar line read a moment later"]


def test_both_outcomes_side_by_side() -> None:
    without = Side(state="running, up 3 s", crashed_at_s=57.4, crash_cause=OOM, crashes=1, succeeded=541, failed=320)
    with_sidecar = Side(state="running, up 20 s", restarted_at_s=44.6, succeeded=484, interrupted=32)
    lines = side_lines(without, with_sidecar)
    assert lines == [
        "without the sidecar: crashed at 57 s: CUDA out of memory; 541 ok, 320 failed",
        "with the sidecar:    restarted at 45 s; 484 ok, 0 failed, 32 interrupted by the stop",
    ]
    hung = Side(state="running, up 50 s", in_flight=16, oldest_in_flight_s=38.2, succeeded=48)
    assert side_lines(hung, with_sidecar)[0].startswith("without the sidecar: hung: 16 requests unanswered for 38 s")
    assert side_lines(None, with_sidecar) == [
        "vLLM: restarted by the sidecar at 45 s; 484 ok, 0 failed, 32 interrupted by the stop"
    ]
    assert crash_name("ValueError: max seq len") == "ValueError"


def _policy(state: str, **extra: object) -> dict[str, object]:
    return {"state": state, "reason": f"{state}: because", "readiness": "ready", "admission_paused": False, **extra}


def test_the_problems_line_agrees_with_the_policys_state() -> None:
    paused = _policy(
        "paused",
        admission_paused=True,
        readiness="paused: GPU free memory 3.9 % < 5.0 % of total on GPU 0",
        reason="would restart (oom_forecast): forecast time to OOM 98 s < 900 s; but vLLM up only 33 s < 40 s",
    )
    lines = problem_lines({"policy": paused, "problems": []})
    assert lines == ["paused: GPU free memory 3.9 % < 5.0 % of total on GPU 0"]
    assert problem_lines({"policy": _policy("normal"), "problems": []}) == []
    restarting = problem_lines({"policy": _policy("restarting"), "problems": ["vLLM unreachable"]})
    assert restarting == ["restarting: because", "vLLM unreachable"]
    assert decision(paused).plain.startswith("sidecar policy: PAUSED  admission PAUSED (/readyz 503)\nwhy: ")
    assert problems({"policy": paused, "problems": []}).plain == (
        "problems: paused: GPU free memory 3.9 % < 5.0 % of total on GPU 0"
    )
    hung = _policy("paused", admission_paused=True, readiness="paused: no progress", reason="paused: no progress")
    assert problems({"policy": hung, "problems": []}).plain == "problems: the policy's, in why above"


def _status() -> dict[str, object]:
    return {
        "policy": _policy(
            "paused",
            admission_paused=True,
            readiness="paused: GPU free memory 3.9 % < 5.0 % of total on GPU 0",
            would_restart_but="vLLM up only 33 s < 40 s before a forecast-driven restart",
        ),
        "problems": [],
        "engines": [{"model_name": "sim-llama", "engine": "0", "kv_cache_usage_ratio": 0.056, "requests_running": 24}],
        "gpus": [
            {
                "gpu": 0,
                "memory_used_bytes": 76.9 * GIB,
                "memory_total_bytes": 80 * GIB,
                "memory_budget_bytes": 72 * GIB,
                "memory_over_budget_bytes": 4.9 * GIB,
                "memory_growth_bytes_per_second": 31 * 2**20,
                "time_to_oom_seconds": 98.0,
            }
        ],
    }


def _frame(events: int) -> Frame:
    header = Header(
        scenario="leak",
        sim_url="http://127.0.0.1:40001",
        sidecar_url="http://127.0.0.1:40002",
        elapsed_s=38.0,
        story="GPU memory grows with every request; " * 6,
        settings="shortened for the demo: " + "--a-setting 1 (default 600), " * 8,
        ending="Ctrl-C stops the demo (or once the story is over)",
    )
    lines = [f"{t:5d} s  event number {t} " + "with words " * (t % 17) for t in range(events)]
    without = Side(state="running, up 38 s", succeeded=300)
    mine = Side(state="running, up 38 s", succeeded=290)
    return Frame(header=header, status=_status(), sides=side_lines(without, mine), events=lines, footer=header.ending)


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40), (60, 16), (200, 60)])
def test_the_frame_fits_the_terminal_and_keeps_the_newest_event_and_the_decision(width: int, height: int) -> None:
    console = Console(file=io.StringIO(), width=width, height=height, color_system=None)
    frame = _frame(events=60)
    console.print(screen(frame, console, width, height - 1))
    rows = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert len(rows) <= height - 1
    assert max(len(row) for row in rows) <= width
    text = "\n".join(rows)
    assert "sidecar policy: PAUSED" in text or "state: PAUSED" in text
    assert "   59 s  event number 59" in text, "the newest event"
    assert "without the sidecar:" in text
    assert "with the sidecar:" in text
    assert rows[-1].startswith("Ctrl-C stops the demo")
    if width >= 100 and height >= 40:
        assert "time to OOM" in text
        assert "┃" in text, "the tables, where there is room"
    if (width, height) == (80, 24):
        assert "time to OOM 98 s" in text
        assert "problems: paused: GPU free memory 3.9 %" in text
