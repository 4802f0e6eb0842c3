"""The StartRequest: the shipped example parses; each error names its field path."""

from __future__ import annotations

import json
import pathlib

import pytest

from tests import k8sformats
from toolkit import request

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "start-request.yaml"

BASE = {
    "jobId": "job-1",
    "generation": 1,
    "submission": 2,
    "attempt": 0,
    "command": ["python", "train.py"],
    "namespace": "ns",
    "runtimeRef": {"name": "torch-distributed"},
}


def test_the_shipped_example_parses() -> None:
    req = request.load(str(EXAMPLE))
    assert req.job_id == "team-a.llama-finetune"
    assert req.mode == "kueue" and req.queue_name == "team-a"
    assert req.command == ("python", "train.py", "--epochs", "3")
    assert [v.name for v in req.env] == ["HF_HOME", "LOG_LEVEL"]
    assert req.resources_per_node == {"limits": {"nvidia.com/gpu": "1", "memory": "32Gi"}}
    assert req.name == request.default_name(job_id=req.job_id, submission=2)
    assert len(req.name) <= request.DERIVED_NAME_MAX_LENGTH


def test_defaults() -> None:
    req = request.from_dict(BASE)
    assert req.runtime_ref == request.RuntimeRef("ClusterTrainingRuntime", "torch-distributed")
    assert req.mode == "plain" and req.queue_name is None and not req.allow_rank_restart
    assert req.epoch_prefix == "1000002" and req.token_prefix == "job-1.2.0"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"env": [{"name": "A", "value": "1"}, {"name": "B"}, {"name": "DISPATCH_X", "value": ""}]},
         "env[2].name: must not start with DISPATCH_"),
        ({"env": {"DISPATCH_EPOCH": "1"}}, "env.DISPATCH_EPOCH: must not start with DISPATCH_"),
        ({"env": {"N": 1}}, "env.N: must be a string (quote it)"),
        ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "env[1].name: 'A' is already env[0]"),
        ({"env": [{"name": "A", "valu": "1"}]}, "env[0].valu: unknown field"),
        ({"jobId": 83}, "jobId: must be a string (quote it), found int 83"),
        ({"jobId": "a b"}, "jobId: job id = 'a b' holds a space"),
        ({"generation": "1"}, "generation: must be an integer, found str '1'"),
        ({"generation": 9_223_373}, "generation: G (generation) = 9223373 is above 9223372"),
        ({"generation": 9_223_372, "submission": 36_855}, "generation: epoch"),
        ({"submission": 1_000_000}, "submission: N (submission) = 1000000 reached the bound 1000000"),
        ({"attempt": -1}, "attempt: attempt = -1 is below 0"),
        ({"command": []}, "command: must be a non-empty list"),
        ({"command": ["python", 3]}, "command[1]: must be a string"),
        ({"command": ["-x"]}, "command[0]: must not start with '-'"),
        ({"mode": "kueue"}, "queueName: is required in kueue mode"),
        ({"queueName": "q"}, "queueName: is only used in kueue mode"),
        ({"runtimeRef": {"kind": "Runtime", "name": "x"}}, "runtimeRef.kind: must be one of"),
        ({"runtimeRef": {"kind": "TrainingRuntime"}}, "runtimeRef.name: is required"),
        ({"name": "9abc"}, "name: must be an RFC 1035 label"),
        ({"name": "a" * 64}, "name: must be at most 63 characters"),
        ({"namespace": "Ns"}, "namespace: must be a DNS-1123 label"),
        ({"numNodes": 0}, "numNodes: must be between 1 and"),
        ({"resourcesPerNode": {"limits": {"cpu": "lots"}}}, "resourcesPerNode.limits.cpu: is not a Kubernetes quantity"),
        ({"resourcesPerNode": {"requests": {"cpu": "-1"}}},
         "resourcesPerNode.requests.cpu: is not a Kubernetes quantity of zero or more, found '-1'"),
        ({"resourcesPerNode": {"limits": {"memory": "1Gi\n"}}}, "resourcesPerNode.limits.memory: is not a Kubernetes"),
        ({"namespace": "ns\n"}, "namespace: must be a DNS-1123 label"),
        ({"name": "abc\n"}, "name: must be an RFC 1035 label"),
        ({"resourcesPerNode": {"limit": {}}}, "resourcesPerNode.limit: unknown field"),
        ({"allowRankRestart": "yes"}, "allowRankRestart: must be true or false"),
        ({"numnodes": 2}, "numnodes: unknown field"),
    ],
)
def test_errors_name_the_field(change: dict[str, object], message: str) -> None:
    with pytest.raises(request.RequestError) as info:
        request.from_dict({**BASE, **change})
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_required_fields() -> None:
    for key in BASE:
        doc = {k: v for k, v in BASE.items() if k != key}
        with pytest.raises(request.RequestError, match=f"^{key}: is required"):
            request.from_dict(doc)


def test_json_and_duplicate_keys(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(BASE))
    assert request.load(str(path)).job_id == "job-1"
    path.write_text('{"jobId": "a", "jobId": "b"}')
    with pytest.raises(ValueError, match="'jobId' appears twice"):
        request.load(str(path))
    yml = tmp_path / "r.yaml"
    yml.write_text("jobId: a\njobId: b\n")
    with pytest.raises(ValueError, match="line 1: key 'jobId' appears twice"):
        request.load(str(yml))


def test_default_name_is_stable_short_and_distinct() -> None:
    a = request.default_name(job_id="Team/A.B", submission=7)
    assert a == request.default_name(job_id="Team/A.B", submission=7)
    assert a != request.default_name(job_id="team-a-b", submission=7)  # same slug, different id
    assert request.default_name(job_id="9" * 200, submission=999_999).startswith("j-")
    for name in (a, request.default_name(job_id="x" * 253, submission=999_999)):
        assert len(name) <= 32 and k8sformats.is_rfc1035_label(name)
