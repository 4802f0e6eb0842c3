"""Plain mode without the controller still notices: open, release and status
record the JobSet UID and flag a different one, open and release check the
runtime again, and the foreign cause list stays whole, bounded and quiet
(each cause announced once). Against the real apiserver and CRDs."""

from __future__ import annotations

import pytest

from tests.adapter import kit
from toolkit import adapter, causes, clusterconfig, detect, kube, names, paths

pytestmark = pytest.mark.cluster


@pytest.fixture
def client(api_client):
    return kube.from_api_client(api_client)


def _foreign_events(client, namespace, name):
    events, _ = client.list(paths.EVENT, namespace=namespace, field_selector=f"reason={names.FOREIGN_REASON}")
    return [e["message"] for e in events if e["involvedObject"]["name"] == name]


def test_open_records_the_jobset_uid_and_release_flags_a_recreated_jobset(client, namespace):
    tj = kit.create_trainjob(client, namespace)
    name = tj["metadata"]["name"]
    first = kit.create_jobset(client, tj)  # Trainer builds it while the TrainJob is suspended
    assert adapter.open_(client, namespace=namespace, name=name).jobset_reset is None
    assert kit.annotations(client, namespace, name)[names.JOBSET_UID_ANNOTATION] == first["metadata"]["uid"]
    adapter.hold(client, namespace=namespace, name=name)
    client.delete(paths.JOBSET, name=name, namespace=namespace)
    second = kit.create_jobset(client, tj)
    cause = (f"JobSet UID {second['metadata']['uid']} is not the recorded {first['metadata']['uid']}: "
             "J may have been reset")
    released = adapter.release(client, namespace=namespace, name=name)
    assert released.jobset_reset == cause
    assert (released.admission, kit.annotations(client, namespace, name)[names.FOREIGN_ANNOTATION]) == (2, cause)
    assert _foreign_events(client, namespace, name) == [cause]
    # detection, not prevention: the release went ahead
    assert client.get(paths.TRAINJOB, name=name, namespace=namespace)["spec"]["suspend"] is False


def test_status_records_the_uid_and_reports_a_mismatch_once(client, namespace):
    tj = kit.create_trainjob(client, namespace)
    name = tj["metadata"]["name"]
    first = kit.create_jobset(client, tj)
    st = adapter.status(client, namespace=namespace, name=name)
    assert (st.jobset_uid, st.jobset_uid_mismatch, st.foreign) == (first["metadata"]["uid"], False, False)
    client.delete(paths.JOBSET, name=name, namespace=namespace)
    second = kit.create_jobset(client, tj)
    for _ in range(3):
        st = adapter.status(client, namespace=namespace, name=name)
    assert (st.jobset_uid, st.jobset_uid_seen, st.jobset_uid_mismatch, st.foreign) == (
        first["metadata"]["uid"], second["metadata"]["uid"], True, True)
    assert len(_foreign_events(client, namespace, name)) == 1


def test_open_refuses_a_runtime_edited_after_start_naming_the_field(client, namespace):
    tj = kit.create_trainjob(client, namespace)
    name = tj["metadata"]["name"]

    def edit(runtime):
        runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] = 3
        return runtime, None

    client.read_modify_write(paths.TRAINING_RUNTIME, name=kit.RUNTIME, namespace=namespace, compute=edit)
    with pytest.raises(adapter.AdapterError) as refused:
        adapter.open_(client, namespace=namespace, name=name)
    message = str(refused.value)
    assert message.startswith(f"runtime {kit.RUNTIME}: ") and "\n" not in message
    assert "backoffLimit" in message and "3" in message, message
    after = client.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert after["spec"]["suspend"] is True and names.FLOOR_ANNOTATION not in after["metadata"].get("annotations", {})


def test_a_full_cause_list_keeps_whole_lines_counts_the_rest_and_announces_each_cause_once(client, namespace):
    tj = kit.create_trainjob(client, namespace)
    name = tj["metadata"]["name"]
    lines = [f"pod {name}-node-{i}-0 has no annotation dispatch.phpboyscout.uk/admission: " + "x" * 80
             for i in range(120)]
    for _ in range(2):  # every rank reports, then reports again
        for line in lines:
            adapter.flag_foreign(client, namespace=namespace, name=name, violation=detect.Violation("missing-admission", line))
    annotations = kit.annotations(client, namespace, name)
    kept = annotations[names.FOREIGN_ANNOTATION].split("\n")
    assert len(annotations[names.FOREIGN_ANNOTATION]) <= causes.LIMIT
    assert kept == lines[: len(kept)] and len(kept) < len(lines)  # whole lines, the first ones
    assert causes.parse(None, annotations[causes.DROPPED_ANNOTATION]).dropped == len(lines) - len(kept)
    assert sorted(_foreign_events(client, namespace, name)) == sorted(lines)  # each once, none twice
    st = adapter.status(client, namespace=namespace, name=name)
    assert (st.foreign, st.foreign_dropped) == (True, len(lines) - len(kept))


def test_status_for_a_reader_without_update_rights_shows_the_mismatch_without_recording_it(
        control_plane, client, namespace):
    tj = kit.create_trainjob(client, namespace)
    name = tj["metadata"]["name"]
    first = kit.create_jobset(client, tj)
    adapter.record_jobset_uid(client, namespace=namespace, name=name, uid=first["metadata"]["uid"])
    client.delete(paths.JOBSET, name=name, namespace=namespace)
    second = kit.create_jobset(client, tj)
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    client.request("POST", f"{rbac}/namespaces/{namespace}/roles", body={
        "metadata": {"name": "reader"},
        "rules": [{"apiGroups": [names.TRAINER_GROUP], "resources": ["trainjobs"], "verbs": ["get"]},
                  {"apiGroups": [names.JOBSET_GROUP], "resources": ["jobsets"], "verbs": ["get"]}]})
    client.request("POST", f"{rbac}/namespaces/{namespace}/rolebindings", body={
        "metadata": {"name": "reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]})
    reader = clusterconfig.load(kubeconfig=control_plane.mint_kubeconfig(namespace=namespace, service_account="reader"))
    try:
        st = adapter.status(reader, namespace=namespace, name=name)
    finally:
        reader.close()
    assert (st.jobset_uid, st.jobset_uid_seen, st.jobset_uid_mismatch) == (
        first["metadata"]["uid"], second["metadata"]["uid"], True)
    assert names.FOREIGN_ANNOTATION not in kit.annotations(client, namespace, name)  # nothing written
