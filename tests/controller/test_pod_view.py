"""What the controller's pod cache keeps (`views.pod_view`) judges every pod as the whole pod does
(pure: `pod_rules.judge` on both), and drops the command and the variables' values a trainer pod
carries (the prologue, whatever the runtime's env holds)."""

from __future__ import annotations

import json

import hypothesis
import hypothesis.strategies as st

from controller import pod_rules, views
from toolkit import detect, marks, names

TRAINJOB = {
    "apiVersion": f"{names.TRAINER_GROUP}/{names.TRAINER_VERSION}", "kind": "TrainJob",
    "metadata": {"name": "tj", "namespace": "ns", "uid": "tj-uid", "creationTimestamp": "2026-01-01T00:00:00Z",
                 "annotations": {names.FLOOR_ANNOTATION: "3", names.JOBSET_UID_ANNOTATION: "js-1"}},
}


def mostly(usual: object, *others: object) -> st.SearchStrategy:
    """USUAL three times in four: a pod the rules judge all the way to the prologue's inputs is then
    drawn often, not once in hundreds."""
    return st.sampled_from([usual] * (3 * len(others)) + list(others))


ENV_NAMES = st.sampled_from([*detect.PROLOGUE_INPUTS, "PATH", "HF_TOKEN"])
VARIABLE = st.one_of(st.fixed_dictionaries({"name": ENV_NAMES, "value": st.text(max_size=5)}),
                     st.fixed_dictionaries({"name": ENV_NAMES}), st.just("not a variable"))
# Often every prologue input, in any order among others, so that the rule's both outcomes are drawn.
ENV = st.builds(lambda inputs, keep, others, at: [*others[:at], *[{"name": n} for n in inputs[:keep]], *others[at:]],
                st.permutations(detect.PROLOGUE_INPUTS), st.sampled_from([4, 4, 3, 0]),
                st.lists(VARIABLE, max_size=3), st.integers(0, 3))
CONTAINER = st.one_of(
    st.fixed_dictionaries({"name": mostly(names.TRAINER_CONTAINER, "sidecar"),
                           "command": st.just(["sh", "-c", "#!/bin/sh\n" * 500]), "image": st.just("trainer:1")},
                          optional={"env": st.one_of(ENV, st.none(), st.just("not a list"))}),
    st.just("not a container"))
SPEC = st.one_of(st.fixed_dictionaries({"containers": st.lists(CONTAINER, min_size=1, max_size=3)}),
                 st.none(), st.fixed_dictionaries({"containers": st.sampled_from([None, {}])}))


@st.composite
def pods(draw: st.DrawFn) -> dict:
    labels = {names.JOBSET_NAME_LABEL: "tj", names.RESTART_LABEL: draw(mostly("0", "1", "x")),
              marks.REPLICATED_JOB_LABEL: draw(mostly(names.TRAINER_REPLICATED_JOB, "launcher"))}
    if draw(st.booleans()):
        labels[names.JOBSET_UID_LABEL] = draw(mostly("js-1", "js-2"))
    admission = draw(mostly("3", None, "0", "2", "4", "03"))
    meta = {"name": "tj-node-0-0-abcde", "namespace": "ns", "uid": "pod-uid", "labels": labels,
            "annotations": {} if admission is None else {names.ADMISSION_ANNOTATION: admission},
            "creationTimestamp": draw(mostly("2026-01-02T00:00:00Z", "2025-12-31T00:00:00Z")),
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]}
    if draw(mostly(False, True)):
        meta["deletionTimestamp"] = "2026-01-03T00:00:00Z"
    pod = {"metadata": meta, "status": {"phase": draw(mostly("Running", "Pending", "Succeeded"))}}
    spec = draw(SPEC)
    if spec is not None:
        pod["spec"] = spec
    return pod


@hypothesis.given(pod=pods(), admitted=st.sampled_from([None, True, False]))
@hypothesis.settings(max_examples=300, deadline=None)
def test_the_view_judges_every_pod_as_the_whole_pod_does(pod: dict, admitted: bool | None) -> None:
    assert pod_rules.judge(views.pod_view(pod), TRAINJOB, admitted=admitted) == pod_rules.judge(
        pod, TRAINJOB, admitted=admitted)


def test_the_view_keeps_the_names_and_drops_the_command_the_values_and_the_managed_fields() -> None:
    env = [{"name": names.ENV_ADMISSION, "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations"}}},
           {"name": "HF_TOKEN", "value": "hf_secret"}]
    pod = {"metadata": {"name": "p", "managedFields": [{}]}, "status": {"phase": "Running"},
           "spec": {"containers": [{"name": names.TRAINER_CONTAINER, "command": ["sh", "-c", "x" * 20_000],
                                    "env": env}],
                    "volumes": [{"name": "v"}]}}
    view = views.pod_view(pod)
    assert view == {"metadata": {"name": "p"}, "status": {"phase": "Running"},
                    "spec": {"containers": [{"name": names.TRAINER_CONTAINER,
                                             "env": [{"name": names.ENV_ADMISSION}, {"name": "HF_TOKEN"}]}]}}
    assert "hf_secret" not in json.dumps(view) and len(json.dumps(view)) < 300
    assert pod_rules.judge(view, TRAINJOB) == pod_rules.judge(pod, TRAINJOB)
