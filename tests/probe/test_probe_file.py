"""The probe file parser: the documented shape becomes a ProbeProcess; anything else is refused with one line."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from sidecar.model.allocator import ProcessRole
from sidecar.parse.probe_file import ProbeFileError, parse_probe_file
from tests.probe.documents import GIB, device, document


def _parse(content: Any) -> Any:
    return parse_probe_file(json.dumps(content).encode())


def test_the_documented_shape_parses() -> None:
    process = _parse(document(42, time_unix_s=1000.0, devices=[device(1, num_alloc_retries=3)]))
    assert process.pid == 42
    assert process.role is ProcessRole.WORKER
    assert process.rank == 0
    assert process.interval_s == 2.0
    (gpu,) = process.devices
    assert (gpu.index, gpu.reserved_bytes, gpu.inactive_split_bytes, gpu.alloc_retries) == (1, 8 * GIB, 2 * GIB, 3)


def test_a_process_without_cuda_says_why() -> None:
    process = _parse(document(7, time_unix_s=1.0, role="api", rank=None, devices=[]))
    assert not process.cuda_available
    assert process.reason == "CUDA is not initialised"
    assert process.devices == ()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(role="scheduler"), "role is not api, engine, worker or other"),
        (lambda d: d.update(pid=True), "pid is not a non-negative integer"),
        (lambda d: d.update(rank=-1), "rank is not a non-negative integer"),
        (lambda d: d.update(time_unix_s="now"), "time_unix_s is not a number"),
        (lambda d: d.update(interval_s=0), "interval_s is out of range"),
        (lambda d: d.pop("interval_s"), "interval_s is not a number"),
        (lambda d: d["cuda"].update(available="yes"), "cuda.available is not true or false"),
        (lambda d: d["cuda"].update(devices={}), "cuda.devices is not a list"),
        (lambda d: d["cuda"].update(available=False), "lists devices while cuda.available is false"),
        (lambda d: d["cuda"]["devices"][0].update(num_ooms=1.5), "cuda.devices[0].num_ooms is not a non-negative"),
        (lambda d: d["cuda"]["devices"][0].update(reserved_bytes=-1), "reserved_bytes is not a non-negative"),
        (lambda d: d["cuda"]["devices"][0].pop("free_bytes"), "cuda.devices[0].free_bytes is not"),
        (lambda d: d["cuda"]["devices"][0].update(uuid=5), "cuda.devices[0].uuid is not a string"),
        (lambda d: d["cuda"].update(devices=[device(n) for n in range(65)]), "lists 65 devices"),
    ],
)
def test_anything_else_is_refused_with_what_is_wrong(change: Any, message: str) -> None:
    content = document(42, time_unix_s=1000.0)
    change(content)
    with pytest.raises(ProbeFileError, match=re.escape(message)):
        _parse(content)


@pytest.mark.parametrize("data", [b"", b"{", b"\xff\xfe", b"[]", b"null", b"[" * 100_000])
def test_bytes_that_are_not_a_document_are_refused(data: bytes) -> None:
    with pytest.raises(ProbeFileError):
        parse_probe_file(data)
