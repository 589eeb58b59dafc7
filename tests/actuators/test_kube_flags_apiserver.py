"""--remediate's flags target on Kubernetes against a real kube-apiserver 1.20.2 + etcd, with the RBAC of
deploy/kubernetes/add-sidecar/rbac.yaml and deploy/kubernetes/add-remediation/rbac.yaml.

The code under test authenticates as the `vllm-sidecar` ServiceAccount and finds the Deployment through its
own pod, as in the cluster. This server has no controllers, so no rollout happens: what one would roll out is
read from the Deployment's pod template, whose hash is what makes the Deployment controller create a new
ReplicaSet. (`metadata.generation` does not tell: the Deployment strategy bumps it for a change of the
Deployment's own annotations too, as this server shows.) Fixtures act as an admin; each test gets a fresh
namespace.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog

from sidecar.actuators.file_log import FileLog
from sidecar.actuators.kube_client import KubeClient
from sidecar.actuators.kube_flags import FLAGS_ANNOTATION, PERMISSIONS, RECORD_ANNOTATION, DeploymentFlags
from sidecar.actuators.kube_permission import Permission
from sidecar.actuators.remediation_record import RecordError, document_of, flag_words
from sidecar.cli import main
from sidecar.model.remediation import Step, StepState
from sidecar.policy.remediation import parse_allowances, settle
from sidecar.shell.remediating import RemediationSettings, Remediator

from .kube_apiserver import RBAC_FILE, REMEDIATION_RBAC_FILE, ApiServer, Workspace
from .test_kubernetes_apiserver import kubeconfig

VLLM_ARGS = ["--model", "Qwen/Qwen2.5-0.5B-Instruct", "--max-model-len", "2048", "--port", "8000"]
# The sidecar first, as add-sidecar puts it: vLLM's container is found by name, not by place.
POD_SPEC = {
    "containers": [
        {"name": "vllm-sidecar", "image": "ghcr.io/vllm-sidecar/vllm-sidecar:0.1.0"},
        {"name": "vllm", "image": "vllm/vllm-openai:v0.32.0", "args": VLLM_ARGS},
    ]
}
RBAC_FILES = (RBAC_FILE, REMEDIATION_RBAC_FILE)
WALL_S = 1_795_000_000.0
LOGS = Path(__file__).resolve().parents[1] / "doctor" / "logs"


def step(flag: str = "--max-model-len", before: float = 2048, after: float = 992, **changes: Any) -> Step:
    return Step(
        flag=flag,
        before=before,
        after=after,
        file_before=None,
        cause="kv_cache_blowout",
        why="vLLM's own estimate: 992 tokens fit",
        wall_time_s=WALL_S,
        state=changes.pop("state", StepState.PENDING),
        **changes,
    )


@pytest.fixture
def workspace(apiserver: ApiServer, admin: httpx.Client) -> Workspace:
    space = Workspace.create(apiserver, admin)
    space.apply_rbac(files=RBAC_FILES)
    space.create_workload(POD_SPEC)
    return space


@pytest.fixture
async def client(workspace: Workspace) -> AsyncIterator[KubeClient]:
    kube = KubeClient(workspace.credentials(workspace.sidecar_token()), timeout_s=10)
    yield kube
    await kube.close()


def target(space: Workspace, client: KubeClient, pod: str | None = None) -> DeploymentFlags:
    return DeploymentFlags(client=client, pod=pod or space.pod, namespace=space.namespace)


def container_args(deployment: dict[str, Any], name: str = "vllm") -> list[str] | None:
    (found,) = (c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)
    args: list[str] | None = found.get("args")
    return args


def annotations_of(deployment: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = deployment["metadata"].get("annotations", {})
    return found


def generation(deployment: dict[str, Any]) -> int:
    value: int = deployment["metadata"]["generation"]
    return value


def appended(*steps: Step) -> Callable[[list[Step]], list[Step]]:
    return lambda record: [*record, *steps]


async def test_a_change_appends_the_flags_to_vllms_args_and_writes_the_record(
    workspace: Workspace, client: KubeClient
) -> None:
    flags = target(workspace, client)
    assert await flags.read() == []
    change = step()
    assert await flags.update(appended(change)) == [change]
    deployment = workspace.deployment_document()
    # Last, after vLLM's own --max-model-len 2048: vLLM's parser keeps the last occurrence.
    assert container_args(deployment) == [*VLLM_ARGS, "--max-model-len", "992"]
    assert container_args(deployment, "vllm-sidecar") is None
    assert json.loads(annotations_of(deployment)[RECORD_ANNOTATION]) == document_of([change])
    assert json.loads(annotations_of(deployment)[FLAGS_ANNOTATION]) == ["--max-model-len", "992"]
    assert "annotations" not in deployment["spec"]["template"]["metadata"]  # the record is not in the template
    assert await flags.read() == [change]
    assert flags.where == f"Deployment vllm in namespace {workspace.namespace}, container vllm's args"


async def test_a_second_change_replaces_the_sidecars_suffix(workspace: Workspace, client: KubeClient) -> None:
    flags = target(workspace, client)
    first = step()
    await flags.update(appended(first))
    confirmed = settle(first, "confirmed: vLLM healthy for 1800 seconds", WALL_S + 1800)
    second = step(before=992, after=800)
    await flags.update(lambda _record: [confirmed, second])
    assert container_args(workspace.deployment_document()) == [*VLLM_ARGS, "--max-model-len", "800"]
    third = step(flag="--max-num-seqs", before=256, after=128)
    await flags.update(appended(third))
    deployment = workspace.deployment_document()
    assert container_args(deployment) == [*VLLM_ARGS, "--max-model-len", "800", "--max-num-seqs", "128"]
    assert json.loads(annotations_of(deployment)[FLAGS_ANNOTATION]) == [
        "--max-model-len",
        "800",
        "--max-num-seqs",
        "128",
    ]
    assert [s.after for s in await flags.read()] == [992, 800, 128]


async def test_confirming_a_change_writes_the_record_only_and_rolls_nothing(
    workspace: Workspace, client: KubeClient
) -> None:
    flags = target(workspace, client)
    change = step()
    await flags.update(appended(change))
    before = workspace.deployment_document()
    confirmed = settle(change, "confirmed: vLLM healthy for 1800 seconds", WALL_S + 1800)
    await flags.update(lambda record: [confirmed if s == change else s for s in record])
    after = workspace.deployment_document()
    assert after["spec"]["template"] == before["spec"]["template"]  # the same pod template: nothing rolls
    assert after["spec"] == before["spec"]
    assert [s.state for s in await flags.read()] == [StepState.CONFIRMED]
    # Nothing changed at all: nothing is sent.
    await flags.update(lambda record: record)
    assert workspace.deployment_document()["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]


async def test_a_revert_takes_the_flags_out_again(workspace: Workspace, client: KubeClient) -> None:
    flags = target(workspace, client)
    change = step()
    await flags.update(appended(change))
    reverted = settle(change, "reverted: vLLM not healthy within 600 seconds", WALL_S + 600)
    await flags.update(lambda record: [reverted if s == change else s for s in record])
    deployment = workspace.deployment_document()
    assert container_args(deployment) == VLLM_ARGS
    assert json.loads(annotations_of(deployment)[FLAGS_ANNOTATION]) == []
    [kept] = await flags.read()
    assert (kept.state, kept.held) == (StepState.REVERTED, True)


async def test_args_someone_edited_are_refused_in_one_line(workspace: Workspace, client: KubeClient) -> None:
    flags = target(workspace, client)
    await flags.update(appended(step()))
    edited = [*VLLM_ARGS, "--max-model-len", "992", "--enforce-eager"]  # a person added a flag after ours
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": edited}]}}}}
    path = f"/apis/apps/v1/namespaces/{workspace.namespace}/deployments/vllm"
    answer = workspace.admin.patch(
        path, content=json.dumps(patch), headers={"Content-Type": "application/strategic-merge-patch+json"}
    )
    assert answer.is_success, answer.text
    version = workspace.deployment_document()["metadata"]["resourceVersion"]
    with pytest.raises(RecordError) as refused:
        await flags.update(appended(step(flag="--max-num-seqs", before=256, after=128)))
    assert str(refused.value) == (
        "the args of container vllm in Deployment vllm no longer end with the flags the sidecar set "
        "(--max-model-len 992): someone changed them, so nothing is written and a person decides (put them back, "
        f"or take them out with both annotations {FLAGS_ANNOTATION} and {RECORD_ANNOTATION}: docs/remediation.md)"
    )
    assert workspace.deployment_document()["metadata"]["resourceVersion"] == version


async def test_a_write_between_read_and_patch_is_a_conflict_and_loses_no_step(
    workspace: Workspace, client: KubeClient
) -> None:
    """The other replica's sidecar writes its step after this one read the Deployment and before it patches."""
    flags = target(workspace, client)
    theirs, ours = step(flag="--max-num-seqs", before=256, after=128), step()
    path = f"/apis/apps/v1/namespaces/{workspace.namespace}/deployments/vllm"

    def meanwhile(record: list[Step]) -> list[Step]:
        words = flag_words([theirs])
        patch = {
            "metadata": {
                "annotations": {
                    RECORD_ANNOTATION: json.dumps(document_of([theirs])),
                    FLAGS_ANNOTATION: json.dumps(words),
                }
            },
            "spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": [*VLLM_ARGS, *words]}]}}},
        }
        answer = workspace.admin.patch(
            path, content=json.dumps(patch), headers={"Content-Type": "application/strategic-merge-patch+json"}
        )
        assert answer.is_success, answer.text
        return [*record, ours]

    with pytest.raises(RecordError) as conflict:
        await flags.update(meanwhile)
    assert str(conflict.value) == (
        f"Deployment vllm in namespace {workspace.namespace} changed between the sidecar's read and its write "
        "(HTTP 409 Conflict): nothing written; it is read again next time"
    )
    assert await flags.read() == [theirs]  # theirs kept, ours not half-written
    # Read again and written: both steps, the flags of both, once each.
    await flags.update(appended(ours))
    assert await flags.read() == [theirs, ours]
    assert container_args(workspace.deployment_document()) == [
        *VLLM_ARGS,
        "--max-model-len",
        "992",
        "--max-num-seqs",
        "128",
    ]


CASES = list(PERMISSIONS)


@pytest.mark.parametrize("permission", CASES, ids=[f"{p.verb}-{p.resource}" for p in CASES])
async def test_each_permission_is_needed_and_named(
    apiserver: ApiServer, admin: httpx.Client, permission: Permission
) -> None:
    """Taken out of both Roles (add-sidecar's grants the same for mode rollout): one line naming it."""
    space = Workspace.create(apiserver, admin)
    space.apply_rbac(files=RBAC_FILES, without=(permission.verb, permission.resource, permission.group))
    space.create_workload(POD_SPEC)
    kube = KubeClient(space.credentials(space.sidecar_token()))
    try:
        with pytest.raises(RecordError) as refused:
            await target(space, kube).update(appended(step()))
    finally:
        await kube.close()
    group = permission.group or '"" (core)'
    assert str(refused.value) == (
        f"forbidden: cannot {permission.verb} {permission.resource} in namespace {space.namespace} "
        f"as system:serviceaccount:{space.namespace}:vllm-sidecar; the Role must grant verb {permission.verb} "
        f"on resource {permission.resource} in API group {group} (see deploy/kubernetes/add-remediation/rbac.yaml)"
    )
    deployment = space.deployment_document()
    assert (generation(deployment), container_args(deployment)) == (1, VLLM_ARGS)


async def test_the_remediation_role_alone_is_enough(apiserver: ApiServer, admin: httpx.Client) -> None:
    """Without add-sidecar's Role (cut down to a restart mode that needs none of this), add-remediation's does it."""
    space = Workspace.create(apiserver, admin)
    space.post("/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "vllm-sidecar"}})
    space.apply_rbac(files=(REMEDIATION_RBAC_FILE,))
    space.create_workload(POD_SPEC)
    kube = KubeClient(space.credentials(space.sidecar_token()))
    try:
        await target(space, kube).update(appended(step()))
    finally:
        await kube.close()
    assert container_args(space.deployment_document()) == [*VLLM_ARGS, "--max-model-len", "992"]


async def test_the_deployment_is_found_through_the_sidecars_own_pod_chain(
    workspace: Workspace, client: KubeClient
) -> None:
    """The chain walk the rollout restart uses (kube_owner): a pod without a controller, and one whose
    ReplicaSet was replaced, are refused in one line."""
    bare = {"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    workspace.post("/api/v1/namespaces/{ns}/pods", bare)
    with pytest.raises(RecordError) as refused:
        await target(workspace, client, pod="bare").read()
    assert str(refused.value) == "pod bare has no controller, so no Deployment whose vLLM args --remediate could change"
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": workspace.replica_set, "uid": "0" * 8}
    orphan = {
        "metadata": {"name": "orphan", "ownerReferences": [{**owner, "controller": True}]},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    workspace.post("/api/v1/namespaces/{ns}/pods", orphan)
    with pytest.raises(RecordError) as replaced:
        await target(workspace, client, pod="orphan").read()
    assert str(replaced.value).startswith(f"ReplicaSet {workspace.replica_set} in namespace {workspace.namespace} was")
    assert "replaced (uid " in str(replaced.value)


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        (
            {"name": "vllm", "image": "vllm/vllm-openai:v0.32.0"},
            "container vllm in Deployment vllm takes its command line from its image: give vLLM's args in the "
            "Deployment, so the sidecar can append its flags to them",
        ),
        (
            {"name": "mistral", "image": "vllm/vllm-openai:v0.32.0", "args": VLLM_ARGS},
            "Deployment vllm has no container vllm (--vllm-container names vLLM's): nothing written",
        ),
    ],
    ids=["image-command-line", "no-such-container"],
)
async def test_a_container_the_flags_cannot_go_into_is_refused(
    apiserver: ApiServer, admin: httpx.Client, container: dict[str, Any], expected: str
) -> None:
    space = Workspace.create(apiserver, admin)
    space.apply_rbac(files=RBAC_FILES)
    space.create_workload({"containers": [container]})
    kube = KubeClient(space.credentials(space.sidecar_token()))
    try:
        with pytest.raises(RecordError) as refused:
            await target(space, kube).update(appended(step()))
    finally:
        await kube.close()
    assert str(refused.value) == expected
    assert generation(space.deployment_document()) == 1


async def test_the_remediator_changes_the_deployment_and_the_new_pods_sidecar_confirms(
    workspace: Workspace, client: KubeClient, tmp_path: Path
) -> None:
    """vLLM's refused start (a real vLLM 0.32 log) read by the doctor; the change goes into the Deployment and
    no restart is asked for. The rollout's pod (made by hand: a new ReplicaSet of the same Deployment) has a new
    sidecar, which loads the record with the change pending, and confirms it without rolling anything."""
    log = tmp_path / "vllm.log"
    shutil.copy(LOGS / "vllm-0.32-cpu-refused.log", log)
    clock = [0.0]
    restarts: list[str] = []

    def asked(text: str) -> bool:
        restarts.append(text)
        return True

    def remediator(flags: DeploymentFlags) -> Remediator:
        made = Remediator(
            RemediationSettings(
                allowances=parse_allowances("max-model-len=256..4096"),
                max_per_day=3,
                window_s=600.0,
                start_timeout_s=300.0,
            ),
            target=flags,
            source=FileLog(log),
            notify=lambda _note: None,
            logger=structlog.get_logger(),
            dry_run=False,
            clock=lambda: clock[0],
            wall_clock=lambda: WALL_S + clock[0],
        )
        made.restart = asked
        return made

    async def tick(r: Remediator, at: float, *, healthy: bool) -> None:
        clock[0] = at
        r.observe(healthy=healthy, now_s=at)
        for task in (r._check, r._settling):
            if task is not None:
                await task

    old = remediator(target(workspace, client))
    await old.load()
    await tick(old, 0, healthy=False)
    await tick(old, 30, healthy=False)
    assert restarts == []
    deployment = workspace.deployment_document()
    assert container_args(deployment) == [*VLLM_ARGS, "--max-model-len", "992"]
    rolled = deployment["spec"]["template"]
    new_pod = rollout_pod(workspace)
    new = remediator(target(workspace, client, pod=new_pod))
    await new.load()
    assert new.pending is not None
    await tick(new, 100, healthy=True)
    await tick(new, 700, healthy=True)
    deployment = workspace.deployment_document()
    assert [s.state for s in await target(workspace, client).read()] == [StepState.CONFIRMED]
    assert deployment["spec"]["template"] == rolled  # confirmed in the record only: no second rollout
    assert restarts == []


def rollout_pod(space: Workspace) -> str:
    """What the Deployment controller would make for the new template: a ReplicaSet and its pod."""
    deployment = space.deployment_document()
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": space.deployment, "controller": True}
    owner["uid"] = deployment["metadata"]["uid"]
    labels = {**deployment["spec"]["selector"]["matchLabels"], "pod-template-hash": "5f6d7c8b9"}
    template = {**deployment["spec"]["template"], "metadata": {"labels": labels}}
    spec = {"replicas": 1, "selector": {"matchLabels": labels}, "template": template}
    metadata = {"name": "vllm-5f6d7c8b9", "labels": labels, "ownerReferences": [owner]}
    replica_set = space.post("/apis/apps/v1/namespaces/{ns}/replicasets", {"metadata": metadata, "spec": spec})
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "vllm-5f6d7c8b9", "controller": True}
    owner["uid"] = replica_set["metadata"]["uid"]
    pod = {"metadata": {"name": "vllm-5f6d7c8b9-q7w2e", "labels": labels, "ownerReferences": [owner]}}
    space.post("/api/v1/namespaces/{ns}/pods", {**pod, "spec": template["spec"]})
    return "vllm-5f6d7c8b9-q7w2e"


@pytest.mark.parametrize(
    ("annotation", "value", "expected"),
    [
        (RECORD_ANNOTATION, "{not json", "annotation vllm-sidecar.io/remediations of Deployment vllm: Expecting"),
        (RECORD_ANNOTATION, '{"version": 1, "steps": [{"flag": 3}]}', "annotation vllm-sidecar.io/remediations"),
        (FLAGS_ANNOTATION, '{"--max-model-len": 992}', "annotation vllm-sidecar.io/flags of Deployment vllm is not"),
    ],
    ids=["record-not-json", "record-not-a-record", "flags-not-a-list"],
)
async def test_annotations_that_are_not_the_sidecars_are_refused(
    workspace: Workspace, client: KubeClient, annotation: str, value: str, expected: str
) -> None:
    """A record the sidecar cannot read could hide a held flag: it changes nothing (and the daemon does not start
    with one, as with a bad remediations.json)."""
    patch = {"metadata": {"annotations": {annotation: value}}}
    path = f"/apis/apps/v1/namespaces/{workspace.namespace}/deployments/vllm"
    answer = workspace.admin.patch(
        path, content=json.dumps(patch), headers={"Content-Type": "application/merge-patch+json"}
    )
    assert answer.is_success, answer.text
    version = workspace.deployment_document()["metadata"]["resourceVersion"]
    with pytest.raises(RecordError) as refused:
        await target(workspace, client).update(appended(step()))
    assert str(refused.value).startswith(expected)
    assert "\n" not in str(refused.value)
    assert workspace.deployment_document()["metadata"]["resourceVersion"] == version


async def test_a_person_lists_and_reverts_on_the_deployment_with_the_command(
    workspace: Workspace, client: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`vllm-sidecar remediations --deployment NAME`, with a kubeconfig as kubectl uses: the record is the
    Deployment's, a revert takes the flags out of vLLM's args (which rolls it out) and holds the flag."""
    await target(workspace, client).update(appended(step(state=StepState.PENDING)))
    config = kubeconfig(tmp_path, workspace.server, {"token": workspace.sidecar_token()}, namespace=workspace.namespace)
    where = ["--deployment", "vllm", "--kubeconfig", str(config)]
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["remediations", "list", *where]) == 0
    listed = capsys.readouterr().out
    assert "--max-model-len 2048 -> 992  (kv_cache_blowout)  pending" in listed
    assert listed.rstrip().endswith(
        f"vLLM's next start gets (Deployment vllm in namespace {workspace.namespace}, container vllm's args): "
        "--max-model-len 992"
    )
    assert await asyncio.to_thread(main, ["remediations", "revert", *where]) == 0
    assert "reverted and held: --max-model-len; the Deployment rolls out with it" in capsys.readouterr().out
    deployment = workspace.deployment_document()
    assert container_args(deployment) == VLLM_ARGS
    [reverted] = await target(workspace, client).read()
    assert (reverted.state, reverted.held) == (StepState.REVERTED, True)
    # A Deployment that is not there: one line, exit 2.
    assert (
        await asyncio.to_thread(main, ["remediations", "list", "--deployment", "nope", "--kubeconfig", str(config)])
        == 2
    )
    assert capsys.readouterr().err.count("\n") == 1
