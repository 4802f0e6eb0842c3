"""Our annotations fit a byte budget (toolkit.history.BUDGET), whatever text the causes and the
reasons hold: JSON escapes a character past the BMP to 12 bytes, so a history bounded in characters
could pass the apiserver's 256 KiB and then every write of ours would fail.

The adapter's own writes (`record_execution`, `flag_foreign`, `adopt`, `raise_admission`) run
against an in-memory TrainJob that refuses, as the apiserver does (422), annotations past 256 KiB
together; the rules under test are the budget's, so no cluster is needed here (the refusal by the
real apiserver is tests/controller/test_adopt_takes_what_was_reviewed.py's)."""

from __future__ import annotations

import copy
import json

import hypothesis
import hypothesis.strategies as st
import pytest

from devcluster import objects
from toolkit import adapter, causes, detect, flagmark, history, kube, names, paths

APISERVER_LIMIT = 256 * 1024
T0 = "2026-12-04T10:00:00Z"


def _all_bytes(annotations: dict[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode("utf-8", "surrogatepass")) for k, v in annotations.items())


class OneTrainJob(kube.Client):
    """One TrainJob behind resourceVersion preconditions; annotations past 256 KiB together are
    refused with 422, as the apiserver refuses them. I/O only: no rule of ours lives here."""

    def __init__(self, trainjob: dict) -> None:  # no transport: every call it serves is below
        self.obj = trainjob
        self.obj["metadata"].update(namespace="ns", uid="tj-uid", resourceVersion="1")
        self.refused = 0
        self.warnings: list[str] = []

    def get(self, res, *, name, namespace=None):
        if res != paths.TRAINJOB:
            raise kube.NotFound(404, "NotFound", "none")
        return copy.deepcopy(self.obj)

    def list(self, res, *, namespace=None, label_selector=None, field_selector=None):
        return [], "1"

    def replace(self, res, obj, *, subresource=None, field_manager=None):
        assert res == paths.TRAINJOB
        if obj["metadata"]["resourceVersion"] != self.obj["metadata"]["resourceVersion"]:
            raise kube.Conflict(409, "Conflict", "the object has been modified")
        if _all_bytes(obj["metadata"].get("annotations") or {}) > APISERVER_LIMIT:
            self.refused += 1
            raise kube.Invalid(422, "Invalid", "metadata.annotations: Too long: must have at most 262144 bytes")
        self.obj = copy.deepcopy(obj)
        self.obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        if field_manager == names.ADOPT_FIELD_MANAGER:
            self.obj["metadata"]["managedFields"] = [{"manager": field_manager, "operation": "Update", "time": T0}]
        return copy.deepcopy(self.obj)

    def event(self, *, involved, reason, message, component, type_="Normal"):
        if type_ == "Warning":
            self.warnings.append(message)
        return {}


def _trainjob(extra: dict[str, str]) -> dict:
    tj = objects.trainjob_body("tj")
    tj["metadata"]["annotations"] = dict(extra)
    return tj


# Text as people and pods write it: ASCII mixed with characters past the BMP (12 bytes each in JSON),
# a drawn piece repeated so that a few causes fill the flag (hypothesis draws short text by itself).
_TEXT = st.builds(
    lambda piece, times: (piece * times)[:4000],
    st.text(alphabet=st.one_of(st.characters(min_codepoint=0x1F600, max_codepoint=0x1F64F),
                               st.characters(codec="ascii", exclude_categories=("Cc",))), min_size=1, max_size=40),
    st.integers(1, 400),
)

_STEP = st.one_of(
    st.tuples(st.just("observe"), st.integers(1, 40), st.integers(0, 3), st.text("abcdef0123456789-", max_size=60)),
    st.tuples(st.just("flag"), _TEXT),
    st.tuples(st.just("adopt"), _TEXT),
    st.tuples(st.just("raise")),
)


@hypothesis.settings(max_examples=60, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(steps=st.lists(_STEP, min_size=1, max_size=40),
                  ours_filler=st.one_of(st.integers(0, 160 * 1024), st.integers(140 * 1024, 160 * 1024)),
                  theirs_filler=st.integers(0, 60 * 1024))
def test_our_annotations_never_pass_the_budget_and_the_mark_never_falls(steps, ours_filler, theirs_filler):
    """Whatever is observed, flagged and adopted, and whatever else (ours or others') the object
    holds within its share: every write lands, ours stay within the budget, the mark never falls,
    and a flag is never lost."""
    extra = {f"{names.DOMAIN}/note": "n" * ours_filler, "example.com/notes": "t" * theirs_filler}
    client = OneTrainJob(_trainjob(extra))
    highest = 0
    for step in steps:
        kind = step[0]
        if kind == "observe":
            _, a, j, pod = step
            obs = history.Observation(a=a, j=j, jobset_uid="u", epoch=None, attempt=None, pod=f"tj-node-{pod}",
                                      time=T0, ended=None, verdict="ok", created=T0)
            adapter.record_execution(client, namespace="ns", name="tj", observation=obs)
            highest = max(highest, a + j)
        elif kind == "flag":
            adapter.flag_foreign(client, namespace="ns", name="tj", violation=detect.Violation("r-repeat", step[1]))
            assert flagmark.is_flagged(client.obj)
        elif kind == "adopt" and flagmark.is_flagged(client.obj):
            reviewed = adapter.compute_status(client.obj, None).foreign_fingerprint or ""
            adapter.adopt(client, namespace="ns", name="tj", reason=step[1], reviewed=reviewed)
            assert not flagmark.is_flagged(client.obj)
        elif kind == "raise" and client.obj["spec"].get("suspend"):
            adapter.raise_admission(client, namespace="ns", name="tj", unsuspend=True)
        annotations = client.obj["metadata"].get("annotations") or {}
        assert history.ours(annotations) <= history.BUDGET
        assert history.of(client.obj).high_water == highest  # every R seen, never lowered by a drop
    assert client.refused == 0


def test_the_history_gives_way_oldest_first_and_counts_what_it_dropped():
    h = history.History()
    for i in range(history.MAX_ADOPTIONS):
        h, _ = history.adopt(h, time=T0, reason=f"reason {i} \U0001F600", causes=[f"cause {i} " + "\U0001F600" * 600],
                             dropped=0, restarts=0, jobset_uid=None)
    for r in range(1, history.MAX_EXECUTIONS + 1):
        h = history.observe(h, history.Observation(a=r, j=0, jobset_uid="u", epoch=None, attempt=None, pod=f"p{r}",
                                                   time=T0, ended=None, verdict="ok")) or h
    limit = len(history.render(h)) - 2 * 7000  # room for three adoptions' causes of five
    fitted = history.fit(h, limit=limit)
    assert len(history.render(fitted)) <= limit
    assert [bool(d.causes) for d in fitted.adoptions] == [False, False, True, True, True]
    assert [d.dropped for d in fitted.adoptions] == [1, 1, 0, 0, 0]
    assert fitted.executions == h.executions and fitted.high_water == h.high_water == history.MAX_EXECUTIONS
    least = history.fit(h, limit=0)  # nothing droppable left: the mark and the counts stay
    assert (least.adoptions, least.executions) == ((), ())
    assert (least.adoptions_dropped, least.dropped, least.high_water) == (5, 20, 20)


def test_an_adoptions_causes_and_reason_are_bounded_in_the_bytes_the_annotation_holds():
    h, _ = history.adopt(history.History(), time=T0, reason="\U0001F600" * 5000,
                         causes=["\U0001F600" * 400] * 10, dropped=2, restarts=0, jobset_uid=None)
    (d,) = h.adoptions
    assert len(json.dumps(d.reason)) - 2 <= history.REASON_LIMIT
    assert sum(len(json.dumps(c)) - 2 for c in d.causes) <= history.CAUSES_LIMIT
    assert d.causes and all(c == "\U0001F600" * 400 for c in d.causes)  # whole lines
    assert d.dropped == 2 + 10 - len(d.causes)


def test_the_kept_causes_are_bounded_in_utf8_bytes():
    current = causes.parse(None, None)
    for i in range(5000):
        current = causes.add(current, f"{i} " + "\U0001F600" * 50) or current
    foreign, _ = causes.render(current)
    assert len(foreign.encode()) <= causes.LIMIT < len(foreign.encode()) + 4 * 60
    assert current.dropped == min(causes.DIGESTS, 5000 - len(current.kept))


@pytest.mark.parametrize("theirs", [250 * 1024])
def test_a_flag_the_apiserver_refuses_still_goes_out_as_the_label_and_a_warning(theirs):
    """Others' annotations fill the object: the causes cannot be written, the flag can."""
    client = OneTrainJob(_trainjob({"example.com/notes": "t" * theirs}))
    cause = "pod p runs A=1 J=0, R 1, not above the highest R 2 of an earlier execution \U0001F600" * 100
    assert adapter.flag_foreign(client, namespace="ns", name="tj", violation=detect.Violation("r-repeat", cause))
    assert client.refused == 1 and flagmark.is_flagged(client.obj) and flagmark.is_labelled(client.obj)
    assert names.FOREIGN_ANNOTATION not in client.obj["metadata"]["annotations"]
    assert client.warnings and client.warnings[0].endswith("(not kept on the TrainJob: its annotations are full)")
    status = adapter.compute_status(client.obj, None)
    assert status.foreign and status.foreign_fingerprint == causes.fingerprint(causes.parse(None, None))
