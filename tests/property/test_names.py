"""systemd unit names and Kubernetes names: the validators against grammars written here from the documents,
and the URLs the Kubernetes adapter builds from whatever names pass.

The oracles are written as character scanners from the documentation, not as the validators' regular
expressions, so the two can disagree:
- systemd.unit(5), "Description": a unit name is a prefix of ASCII letters, digits, ":", "-", "_", "." and
  "\\", then "." and a unit type; at most 255 characters. "prefix@instance.type" is an instance and
  "prefix@.type" a template; the prefix before "@" may not be empty. (systemd's unit_name_is_valid() also
  allows further "@" inside the instance; so does the adapter.)
- Kubernetes, "Object Names and IDs": an RFC 1123 label (namespaces) is at most 63 characters of lowercase
  alphanumerics and "-", starting and ending alphanumeric; a DNS subdomain (pods, ReplicaSets, Deployments,
  Events) is at most 253 characters of such labels joined by "." (the API server checks each label's ends,
  not its length).

Safety beyond the grammar: what passes holds no "/", NUL, whitespace or other unit type, and every request the
adapter sends stays on /api/v1/namespaces/<ns>/pods/<pod> (and the owners' apps/v1 paths), under the server's
own path prefix. A ".." inside a unit name passes, as it does for systemd (three prefix characters): a unit
name is a D-Bus string argument, never a path, and with no "/" it cannot climb anywhere. In a Kubernetes name
".." cannot pass (it is an empty label).
"""

from __future__ import annotations

import asyncio
import json
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache

import httpx
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from sidecar.actuators.base import OutcomeStatus
from sidecar.actuators.kube_client import KubeClient
from sidecar.actuators.kube_names import KubeNameError, check_label, check_subdomain, event_name
from sidecar.actuators.kubernetes import KubernetesActuator, KubernetesEvents, Mode
from sidecar.actuators.unit_name import validate_unit_name
from tests.actuators.kube_apiserver import token_credentials
from tests.property.profile import budget

# --- systemd ------------------------------------------------------------------------------------------------

UNIT_TYPES = ("service", "socket", "device", "mount", "automount", "swap", "target", "path", "timer", "slice", "scope")
UNIT_PREFIX_CHARS = frozenset(string.ascii_letters + string.digits + ":-_.\\")
UNIT_NAME_MAX = 255


def systemd_unit_kind(name: str) -> tuple[str, str] | None:
    """(form, type) of a valid unit name, form being plain, instance or template; None when invalid."""
    if not name or len(name) > UNIT_NAME_MAX:
        return None
    dot = name.rfind(".")
    if dot <= 0 or name[dot + 1 :] not in UNIT_TYPES:
        return None
    prefix = name[:dot]
    if any(char not in UNIT_PREFIX_CHARS and char != "@" for char in prefix):
        return None
    at = prefix.find("@")
    if at == 0:
        return None
    if at == -1:
        return "plain", name[dot + 1 :]
    return ("template" if at == len(prefix) - 1 else "instance"), name[dot + 1 :]


def restartable(name: str) -> bool:
    """What the adapter may restart: a plain or instance service, not a template, not option-like."""
    kind = systemd_unit_kind(name)
    return kind is not None and kind[0] != "template" and kind[1] == "service" and not name.startswith("-")


_UNIT_TEXT = string.ascii_letters + string.digits + ":-_.\\"
_valid_units = st.builds(
    lambda prefix, instance, kind: prefix + ("@" + instance if instance is not None else "") + "." + kind,
    st.text(_UNIT_TEXT, min_size=1, max_size=12),
    st.none() | st.text(_UNIT_TEXT + "@", max_size=8) | st.sampled_from(["", "@", "0@", "a@b", "@@"]),
    st.sampled_from(["service", "service", "service", *UNIT_TYPES]),
)
_UNIT_HOSTILE = ["/", "../", " ", "\t", "\n", "\x00", "é", ".socket", "-", "@", ".", "\\", ".service", "$", ";"]
_unit_names = st.one_of(
    _valid_units,
    st.tuples(_valid_units, st.integers(0, 30), st.sampled_from(_UNIT_HOSTILE)).map(
        lambda t: t[0][: t[1]] + t[2] + t[0][t[1] :]
    ),
    st.builds(lambda n, suffix: "v" * n + suffix, st.integers(240, 260), st.sampled_from([".service", "@0.service"])),
    st.text(max_size=20),
)


@budget(scale=3)
@given(_unit_names)
@example("vllm.service")
@example("vllm@0.service")
@example("vllm@a@b.service")  # systemd's own unit_name_is_valid() accepts a further "@" in the instance
@example("0@@.service")  # the instance "@": used to be refused as a template
@example("a..b.service")  # ".." is three valid prefix characters to systemd; with no "/" it names no path
@example("-vllm.service")
@example("vllm@.service")
@example("x" * 247 + ".service")
@example("x" * 248 + ".service")
def test_unit_names_pass_exactly_when_systemd_would_take_them_for_a_restartable_service(name: str) -> None:
    problem = ""
    try:
        accepted = validate_unit_name(name) == name
    except ValueError as error:
        accepted, problem = False, str(error)
    assert "\n" not in problem
    assert accepted == restartable(name)
    event("accepted" if accepted else "refused")
    if accepted:
        # What passes names one service and nothing else: no path, no other unit type, no option, no byte
        # that a shell, D-Bus or a log line would take for something else.
        assert "/" not in name
        assert name.isascii()
        assert name.isprintable()
        assert not any(char.isspace() for char in name)
        assert name.rsplit(".", 1)[1] == "service"


# --- Kubernetes names -----------------------------------------------------------------------------------------

LABEL_CHARS = frozenset(string.ascii_lowercase + string.digits + "-")
ALNUM = frozenset(string.ascii_lowercase + string.digits)


def rfc1123_label(name: str, *, max_chars: int | None = 63) -> bool:
    if not name or (max_chars is not None and len(name) > max_chars):
        return False
    return all(char in LABEL_CHARS for char in name) and name[0] in ALNUM and name[-1] in ALNUM


def dns_subdomain(name: str) -> bool:
    return 0 < len(name) <= 253 and all(rfc1123_label(part, max_chars=None) for part in name.split("."))


_ALNUM_TEXT = string.ascii_lowercase + string.digits
_kube_labels = st.one_of(
    st.sampled_from(_ALNUM_TEXT),
    st.tuples(st.sampled_from(_ALNUM_TEXT), st.text(_ALNUM_TEXT + "-", max_size=20), st.sampled_from(_ALNUM_TEXT)).map(
        "".join
    ),
)
_kube_subdomains = st.lists(_kube_labels, min_size=1, max_size=4).map(".".join)
# What an attacker (a setting, an environment variable, an API server's answer) would try: a valid name
# with one piece of a path, a query, an encoding or a look-alike letter put in anywhere.
_HOSTILE = ["/", "..", "../", "%2f", "%2F", "?", "#", " ", "\n", "\x00", "A", "_", "é", "\u0131", ".", "-", ":", "@"]
# Where: anywhere, and often at either end, where the first and last character rules apply.
_positions = st.one_of(st.just(0), st.just(-1), st.integers(0, 40))
_kube_hostile = st.tuples(_kube_subdomains, _positions, st.sampled_from(_HOSTILE)).map(
    lambda t: t[0] + t[2] if t[1] == -1 else t[0][: t[1]] + t[2] + t[0][t[1] :]
)
_kube_names = st.one_of(
    _kube_labels,
    _kube_subdomains,
    _kube_hostile,
    st.builds(lambda n, tail: "a" * n + tail, st.integers(60, 66), st.sampled_from(["", "-", "a", ".a"])),
    st.builds(lambda n: ("a" * 62 + ".") * n + "a", st.integers(3, 5)),  # around 253
    st.text(max_size=10),
)


@budget(scale=3)
@given(_kube_names)
@example("\u0131")  # dotless i: re's [a-z] is ASCII only, as Kubernetes means it
@example("a" * 63)
@example("a" * 64)
def test_kubernetes_names_pass_exactly_the_rfc_1123_grammar(name: str) -> None:
    def passes(check: Callable[..., str]) -> bool:
        try:
            return bool(check(name, what="name") == name)
        except KubeNameError as error:
            problem = str(error)
        assert "\n" not in problem
        return False

    assert passes(check_label) == rfc1123_label(name)
    event(f"label: {rfc1123_label(name)}, subdomain: {dns_subdomain(name)}")
    assert passes(check_subdomain) == dns_subdomain(name)


@budget()
@given(
    st.one_of(_kube_subdomains, st.builds(lambda n: ("a" * 62 + ".") * n + "a", st.integers(1, 3))),
    st.integers(0, 2**64 - 1),
)
@example("a" * 253, 2**64 - 1)
@example("a" * 236 + "-" + "b" * 16, 1)
def test_generated_event_names_are_valid_subdomains(object_name: str, wall_time_ns: int) -> None:
    name = event_name(object_name, wall_time_ns)
    assert dns_subdomain(name)
    assert name.endswith(f".{wall_time_ns:x}")


# --- The URLs the adapter builds --------------------------------------------------------------------------------


@dataclass
class FakeApi:
    """Answers as an API server would, with owner names (which the server controls) drawn by the test."""

    replica_set: str = "rs"
    deployment: str = "deploy"

    def answer(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "GET" and "/pods/" in path:
            return _json(200, _owned("pod-uid", "ReplicaSet", self.replica_set, "rs-uid"))
        if request.method == "GET" and "/replicasets/" in path:
            return _json(200, _owned("rs-uid", "Deployment", self.deployment, "deploy-uid"))
        if request.method == "GET" and "/deployments/" in path:
            return _json(200, {"metadata": {"uid": "deploy-uid", "generation": 1}})
        return _json(201 if request.method == "POST" else 200, {"metadata": {"generation": 2}})


def _owned(uid: str, kind: str, name: str, owner_uid: str) -> dict[str, object]:
    owner = {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": owner_uid, "controller": True}
    return {"metadata": {"uid": uid, "ownerReferences": [owner]}}


def _json(status: int, document: dict[str, object]) -> httpx.Response:
    return httpx.Response(status, content=json.dumps(document).encode())


@dataclass
class Recorder:
    """One client per server address for the whole run (building its TLS context costs 30 ms)."""

    handler: Callable[[httpx.Request], httpx.Response] = FakeApi().answer
    seen: list[httpx.Request] | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.seen is not None:
            self.seen.append(request)
        return self.handler(request)


_SERVERS = ("https://k8s.test", "https://k8s.test:6443/cluster/prefix")


@cache
def _client(server: str) -> tuple[KubeClient, Recorder]:
    recorder = Recorder()
    credentials = token_credentials(server, "t", source="test")
    return KubeClient(credentials, transport=httpx.MockTransport(recorder)), recorder


def _expected_paths(mode: Mode, namespace: str, pod: str, api: FakeApi) -> list[tuple[str, str]]:
    core = f"/api/v1/namespaces/{namespace}"
    apps = f"/apis/apps/v1/namespaces/{namespace}"
    if mode is Mode.EVICT:
        return [("POST", f"{core}/pods/{pod}/eviction")]
    if mode is Mode.DELETE:
        return [("DELETE", f"{core}/pods/{pod}")]
    calls = [("GET", f"{core}/pods/{pod}")]
    if not dns_subdomain(api.replica_set):
        return calls  # an owner name that is not a name: the adapter stops there
    calls.append(("GET", f"{apps}/replicasets/{api.replica_set}"))
    if not dns_subdomain(api.deployment):
        return calls
    return [*calls, ("GET", f"{apps}/deployments/{api.deployment}"), ("PATCH", f"{apps}/deployments/{api.deployment}")]


_valid_or_hostile = st.one_of(_kube_labels, _kube_subdomains, _kube_hostile)


@budget()
@given(
    mode=st.sampled_from(Mode),
    server=st.sampled_from(_SERVERS),
    pod=_valid_or_hostile,
    namespace=_valid_or_hostile,
    replica_set=_valid_or_hostile,
    deployment=_valid_or_hostile,
)
@example(  # an owner name from the API server that climbs out of the namespace
    mode=Mode.ROLLOUT,
    server=_SERVERS[0],
    pod="vllm-0",
    namespace="default",
    replica_set="../../../api/v1/namespaces/kube-system/pods/x",
    deployment="d",
)
@example(
    mode=Mode.EVICT, server=_SERVERS[1], pod="../kube-system", namespace="default", replica_set="rs", deployment="d"
)
@example(mode=Mode.DELETE, server=_SERVERS[0], pod="vllm-0", namespace="ns/pods/x?", replica_set="rs", deployment="d")
def test_every_request_stays_on_its_own_pod_and_owners(
    *, mode: Mode, server: str, pod: str, namespace: str, replica_set: str, deployment: str
) -> None:
    client, recorder = _client(server)
    try:
        actuator = KubernetesActuator(mode, pod=pod, namespace=namespace, client=client)
    except ValueError:
        assert not (dns_subdomain(pod) and rfc1123_label(namespace))
        return
    assert dns_subdomain(pod)
    assert rfc1123_label(namespace)
    api = FakeApi(replica_set=replica_set, deployment=deployment)
    recorder.handler, recorder.seen = api.answer, []
    outcome = asyncio.run(actuator.restart(reason="property", dry_run=False))
    prefix = httpx.URL(server).path.rstrip("/")
    sent = [(request.method, request.url.raw_path.decode("ascii")) for request in recorder.seen]
    assert sent == [(method, prefix + path) for method, path in _expected_paths(mode, namespace, pod, api)]
    assert all(request.url.host == "k8s.test" for request in recorder.seen)
    complete = mode is not Mode.ROLLOUT or (dns_subdomain(replica_set) and dns_subdomain(deployment))
    assert (outcome.status is OutcomeStatus.DONE) == complete, outcome.detail
    event(f"{mode} sent {len(sent)} requests")
    assert "\n" not in outcome.detail


_reasons = st.one_of(st.sampled_from(["AdmissionPaused", "RestartStarted"]), st.text(max_size=12))


@budget()
@given(st.sampled_from(_SERVERS), _valid_or_hostile, _valid_or_hostile, _reasons)
def test_events_go_to_their_own_namespace_about_their_own_pod(
    server: str, pod: str, namespace: str, reason: str
) -> None:
    client, recorder = _client(server)
    try:
        events = KubernetesEvents(client, pod=pod, namespace=namespace, wall_clock_ns=lambda: 1_700_000_000 * 10**9)
    except ValueError:
        assert not (dns_subdomain(pod) and rfc1123_label(namespace))
        return
    recorder.handler, recorder.seen = FakeApi().answer, []
    problem = asyncio.run(events.send(reason=reason, message="m\nn", warning=False))
    prefix = httpx.URL(server).path.rstrip("/")
    sent = [(request.method, request.url.raw_path.decode("ascii")) for request in recorder.seen]
    if problem is not None:
        assert sent == []  # an unusable reason is refused before anything is sent
        return
    assert sent == [
        ("GET", f"{prefix}/api/v1/namespaces/{namespace}/pods/{pod}"),
        ("POST", f"{prefix}/api/v1/namespaces/{namespace}/events"),
    ]
    body = json.loads(recorder.seen[-1].content)
    assert dns_subdomain(body["metadata"]["name"])
    assert body["metadata"]["namespace"] == namespace
    assert body["involvedObject"]["name"] == pod


@pytest.fixture(autouse=True, scope="module")
def _close_clients() -> Iterator[None]:
    yield
    for server in _SERVERS:
        asyncio.run(_client(server)[0].close())
    _client.cache_clear()
