"""Every flagged TrainJob is a label query away, on the real apiserver with
the controller as a real process under its shipped RBAC: the controller
flags a TrainJob (its JobSet replaced by hand), and the flag is found with
the kubectl built beside the control plane (`kubectl get trainjobs -A -l
dispatch.phpboyscout.uk/foreign=true`), with `toolkit list -A --foreign`
(the installed console script) and on the leader's gauge
`dispatch_flagged_trainjobs{namespace}` (scraped as Prometheus scrapes it);
an unflagged TrainJob beside it is counted by none. `toolkit adopt` clears
the annotation and the label in one update, and all three lose it."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from devcluster import harness, local, metrics
from tests.adapter import kit
from tests.controller.conftest import wait_until
from toolkit import adapter, detect, flagmark, names, paths

pytestmark = pytest.mark.cluster

TOOLKIT = str(pathlib.Path(__file__).resolve().parents[2] / ".venv" / "bin" / "toolkit")


def _run(argv: list[str], kubeconfig: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    return subprocess.run(argv, env={**env, "KUBECONFIG": kubeconfig}, capture_output=True, text=True,
                          timeout=60, check=False)


def _kubectl_flagged(control_plane) -> list[str]:
    kubectl = str(harness.binary(local.KUBECTL, control_plane.bin_dir))
    got = _run([kubectl, "get", "trainjobs", "-A", "-l", flagmark.SELECTOR,
                "-o", "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{\"\\n\"}{end}"],
               control_plane.kubeconfig)
    assert got.returncode == 0 and got.stderr == "", got.stderr
    return got.stdout.split()


def _toolkit_flagged(control_plane) -> list[str]:
    got = _run([TOOLKIT, "list", "-A", "--foreign", "-o", "json"], control_plane.kubeconfig)
    assert got.returncode == 0 and got.stderr == "", got.stderr
    return [f"{r['namespace']}/{r['name']}" for r in json.loads(got.stdout)["items"]]


def test_a_flagged_trainjob_is_found_by_its_label_and_adopt_clears_both(control_plane, admin, namespace,
                                                                        start_controller):
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    quiet = kit.create_trainjob(admin, namespace)["metadata"]["name"]  # never flagged
    kit.create_jobset(admin, tj)
    adapter.open_(admin, namespace=namespace, name=name)  # records the JobSet's UID
    ctl = start_controller()
    assert f"{namespace}/{name}" not in _kubectl_flagged(control_plane)
    gauge = f'dispatch_flagged_trainjobs{{namespace="{namespace}"}}'
    assert metrics.sample(ctl.get("/metrics")[1], gauge) is None

    # the JobSet is deleted by hand and Trainer builds a new one: the controller flags the TrainJob
    admin.delete(paths.JOBSET, name=name, namespace=namespace)
    kit.create_jobset(admin, tj)
    flagged = wait_until(lambda: flagmark.is_flagged(t := admin.get(paths.TRAINJOB, name=name, namespace=namespace))
                         and t, what="the flag")
    assert flagged["metadata"]["labels"][names.FOREIGN_LABEL] == "true"  # in the update that set the annotation
    ours = [f"{namespace}/{name}"]
    assert [x for x in _kubectl_flagged(control_plane) if x.startswith(f"{namespace}/")] == ours
    assert [x for x in _toolkit_flagged(control_plane) if x.startswith(f"{namespace}/")] == ours
    table = _run([TOOLKIT, "list", "-n", namespace], control_plane.kubeconfig)
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()[1:]}
    assert rows[name][1:3] == ["running", "plain"] and "yes" in rows[name] and "no" in rows[quiet]
    wait_until(lambda: metrics.sample(ctl.get("/metrics")[1], gauge) == 1, what="the flagged gauge at 1")

    shown = _run([TOOLKIT, "status", name, "-n", namespace, "-o", "json"], control_plane.kubeconfig)
    assert shown.returncode == 0, shown.stderr
    reviewed = json.loads(shown.stdout)["foreign_fingerprint"]
    adopted = _run([TOOLKIT, "adopt", name, "-n", namespace, "--reason", "JobSet deleted by hand; checked",
                    "--reviewed", reviewed], control_plane.kubeconfig)
    assert adopted.returncode == 0, adopted.stderr
    after = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert not flagmark.is_flagged(after) and names.FOREIGN_LABEL not in (after["metadata"].get("labels") or {})
    assert not [x for x in _kubectl_flagged(control_plane) if x.startswith(f"{namespace}/")]
    assert not [x for x in _toolkit_flagged(control_plane) if x.startswith(f"{namespace}/")]
    wait_until(lambda: metrics.sample(ctl.get("/metrics")[1], gauge) is None, what="the gauge's series gone")
    empty = _run([TOOLKIT, "list", "-n", namespace, "--foreign"], control_plane.kubeconfig)
    assert (empty.returncode, empty.stdout) == (0, "")
    assert empty.stderr == f"no flagged dispatch TrainJobs found in namespace {namespace}\n"


def test_a_flag_written_without_the_label_gets_it_when_its_cause_is_seen_again(admin, namespace):
    """A TrainJob flagged by a writer that knew no label: the next write of a
    cause it already has adds the label, and no second Event."""
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    cause = "JobSet UID b is not the recorded a: J may have been reset"

    def unlabelled(t):
        t["metadata"].setdefault("annotations", {})[names.FOREIGN_ANNOTATION] = cause
        return t, None

    admin.read_modify_write(paths.TRAINJOB, name=name, namespace=namespace, compute=unlabelled)
    again = adapter.flag_foreign(admin, namespace=namespace, name=name,
                                 violation=detect.Violation(rule="jobset-uid", detail=cause))
    assert again is False  # not a new cause: not announced
    assert flagmark.is_labelled(admin.get(paths.TRAINJOB, name=name, namespace=namespace))
    events, _ = admin.list(paths.EVENT, namespace=namespace, field_selector=f"reason={names.FOREIGN_REASON}")
    assert events == []
