"""The pod log reader against a strict fake of the API server: the exact request, and every answer it can get.

A controller-less kube-apiserver has no kubelet, so a real log request cannot succeed there: the permission
is proved on the real server (tests/actuators/test_kubernetes_apiserver.py), the request's shape and the
reading of its answers here. The fake refuses any request that is not exactly the one the kubelet serves.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from sidecar.actuators.kube_client import KubeClient
from sidecar.actuators.kube_logs import LIMIT_BYTES, TAIL_LINES, PodLog
from sidecar.actuators.log_source import LogUnreadableError, Wanted
from sidecar.shell.cause_reading import explain
from tests.actuators.kube_apiserver import token_credentials
from tests.cause.logs import OOM_CAUSE, OOM_FLAGS, STARTED, WALL_S, oom_death

POD, NAMESPACE, CONTAINER = "vllm-7d4b9c8f6-x2k9p", "ml", "vllm"
TOKEN = "sidecar-token"  # noqa: S105 - the fake API server's, not a secret
PATH = f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}/log"
USER = f"system:serviceaccount:{NAMESPACE}:vllm-sidecar"
Answer = Callable[[bool], httpx.Response]


def status(code: int, reason: str, message: str) -> httpx.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason}
    return httpx.Response(code, json={**body, "code": code})


def text(body: str) -> httpx.Response:
    return httpx.Response(200, content=body.encode(), headers={"Content-Type": "text/plain"})


NO_PREVIOUS = status(400, "BadRequest", f'previous terminated container "{CONTAINER}" in pod "{POD}" not found')


class FakeApiServer:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.asked: list[bool] = []  # previous=true or not, per request

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.method == "GET"
        assert request.url.path == PATH
        assert request.headers["Authorization"] == f"Bearer {TOKEN}"
        params = dict(request.url.params)
        previous = params.pop("previous", None)
        assert previous in (None, "true")
        assert params == {"container": CONTAINER, "tailLines": str(TAIL_LINES), "limitBytes": str(LIMIT_BYTES)}
        self.asked.append(previous == "true")
        return self.answer(previous == "true")


@pytest.fixture
async def kube() -> AsyncIterator[Callable[[Answer], tuple[PodLog, FakeApiServer]]]:
    clients: list[KubeClient] = []

    def make(answer: Answer) -> tuple[PodLog, FakeApiServer]:
        server = FakeApiServer(answer)
        credentials = token_credentials("https://kube.test", TOKEN)
        client = KubeClient(credentials, transport=httpx.MockTransport(server))
        clients.append(client)
        return PodLog(client, pod=POD, namespace=NAMESPACE, container=CONTAINER), server

    yield make
    for client in clients:
        await client.close()


async def test_the_container_that_died_is_the_previous_instance(
    kube: Callable[[Answer], tuple[PodLog, FakeApiServer]],
) -> None:
    log, server = kube(lambda previous: text(oom_death() if previous else STARTED))
    read = await log.read(until_wall_s=WALL_S, wanted=Wanted.DIED)
    assert sorted(server.asked) == [False, True]
    assert read.where == f"log of container {CONTAINER} in pod {POD}"
    assert [run.label for run in read.runs] == ["previous instance", "current instance"]
    cause = explain(read, Wanted.DIED, wall_time_s=WALL_S)
    assert (cause.cause, tuple(change.pasted for change in cause.recommendations)) == (OOM_CAUSE, OOM_FLAGS)
    assert cause.source.startswith(f"log of container {CONTAINER} in pod {POD}, previous instance, ")
    assert cause.evidence[-1] == "how it ended: its container was restarted"


async def test_a_planned_restart_reads_only_the_current_instance(
    kube: Callable[[Answer], tuple[PodLog, FakeApiServer]],
) -> None:
    log, server = kube(lambda previous: text(STARTED))
    read = await log.read(until_wall_s=WALL_S, wanted=Wanted.LAST)
    assert server.asked == [False]
    assert [run.label for run in read.runs] == ["current instance"]


async def test_a_container_never_restarted_has_no_previous_instance(
    kube: Callable[[Answer], tuple[PodLog, FakeApiServer]],
) -> None:
    """An engine dead inside a live server: the current instance's log holds the death."""
    log, _ = kube(lambda previous: NO_PREVIOUS if previous else text(oom_death()))
    read = await log.read(until_wall_s=WALL_S, wanted=Wanted.DIED)
    assert [run.label for run in read.runs] == ["current instance"]
    assert explain(read, Wanted.DIED, wall_time_s=WALL_S).cause == OOM_CAUSE


async def test_only_the_tail_is_kept_from_a_whole_line(kube: Callable[[Answer], tuple[PodLog, FakeApiServer]]) -> None:
    log, _ = kube(lambda previous: NO_PREVIOUS if previous else text("early line\n" * 100_000 + oom_death()))
    (run,) = (await log.read(until_wall_s=WALL_S, wanted=Wanted.DIED)).runs
    assert len(run.text.encode()) <= 256 * 2**10
    assert run.text.startswith("early line\n")
    assert run.text.endswith(oom_death())


async def test_bytes_that_are_not_utf8_are_replaced(kube: Callable[[Answer], tuple[PodLog, FakeApiServer]]) -> None:
    log, _ = kube(lambda previous: NO_PREVIOUS if previous else httpx.Response(200, content=b"\xff\xfe\x00 x\n"))
    (run,) = (await log.read(until_wall_s=WALL_S, wanted=Wanted.DIED)).runs
    assert run.text == "\ufffd\ufffd\x00 x\n"


@pytest.mark.parametrize(
    ("answer", "line"),
    [
        (
            status(
                403,
                "Forbidden",
                f'pods "{POD}" is forbidden: User "{USER}" cannot get resource "pods/log" in API group "" in the '
                f'namespace "{NAMESPACE}"',
            ),
            f"forbidden: cannot get pods/log in namespace {NAMESPACE} as {USER}; the Role must grant verb get on "
            'resource pods/log in API group "" (core) (see deploy/kubernetes/add-sidecar/rbac.yaml)',
        ),
        (
            status(404, "NotFound", f'pods "{POD}" not found'),
            f"not found: the log of container {CONTAINER} in pod {POD} in namespace {NAMESPACE} (HTTP 404: pods "
            f'"{POD}" not found)',
        ),
        (
            status(400, "BadRequest", f"container {CONTAINER} is not valid for pod {POD}"),
            f"get pods/log for the log of container {CONTAINER} in pod {POD} in namespace {NAMESPACE}: the API server "
            f"answered HTTP 400: container {CONTAINER} is not valid for pod {POD}; set --vllm-container to the name "
            f"of vLLM's container (now {CONTAINER})",
        ),
        (
            status(401, "Unauthorized", "Unauthorized"),
            "unauthorized: the API server rejected the credentials from test token (HTTP 401: Unauthorized)",
        ),
    ],
    ids=["forbidden", "gone", "wrong-container", "unauthorized"],
)
async def test_a_refusal_is_one_line_naming_what_to_fix(
    kube: Callable[[Answer], tuple[PodLog, FakeApiServer]], answer: httpx.Response, line: str
) -> None:
    log, _ = kube(lambda previous: answer)
    with pytest.raises(LogUnreadableError) as caught:
        await log.read(until_wall_s=WALL_S, wanted=Wanted.DIED)
    assert str(caught.value) == line


async def test_the_current_instance_unreadable_but_the_previous_read(
    kube: Callable[[Answer], tuple[PodLog, FakeApiServer]],
) -> None:
    """In a crash back-off the current container is waiting: the previous one still says why it died."""
    waiting = status(400, "BadRequest", f'container "{CONTAINER}" in pod "{POD}" is waiting to start: CrashLoopBackOff')
    log, _ = kube(lambda previous: text(oom_death()) if previous else waiting)
    read = await log.read(until_wall_s=WALL_S, wanted=Wanted.DIED)
    assert [run.label for run in read.runs] == ["previous instance"]


async def test_no_answer_at_all(kube: Callable[[Answer], tuple[PodLog, FakeApiServer]]) -> None:
    def refuse(previous: bool) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    log, _ = kube(refuse)
    with pytest.raises(LogUnreadableError) as caught:
        await log.read(until_wall_s=WALL_S, wanted=Wanted.DIED)
    assert str(caught.value) == f"GET {PATH}: cannot connect to https://kube.test: connection refused"


def test_names_are_checked_before_any_request() -> None:
    credentials = token_credentials("https://kube.test", TOKEN, source="test")
    client = KubeClient(credentials, transport=httpx.MockTransport(lambda request: httpx.Response(500)))
    with pytest.raises(ValueError, match=re.escape("container name 'vLLM/../x' is not a valid RFC 1123 label")):
        PodLog(client, pod=POD, namespace=NAMESPACE, container="vLLM/../x")
    assert json.dumps(PodLog(client, pod=POD, namespace=NAMESPACE).params(previous=True)) == json.dumps(
        {"container": "vllm", "tailLines": str(TAIL_LINES), "limitBytes": str(LIMIT_BYTES), "previous": "true"}
    )


async def test_no_content_is_an_empty_log(kube: Callable[[Answer], tuple[PodLog, FakeApiServer]]) -> None:
    """204: what the API server answers for a pod on no node (and for a log not there yet)."""
    log, _ = kube(lambda previous: httpx.Response(204))
    read = await log.read(until_wall_s=WALL_S, wanted=Wanted.DIED)
    assert explain(read, Wanted.DIED, wall_time_s=WALL_S).summary == "vLLM's log is empty"
