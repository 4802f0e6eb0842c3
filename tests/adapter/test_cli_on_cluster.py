"""`toolkit open|hold|release|status` through the CLI against the real
apiserver: the plain-mode life of a TrainJob as an operator drives it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tests.adapter import kit
from toolkit import cli, kube, paths, raising

pytestmark = pytest.mark.cluster


def _suspended_trainjob(control_plane, api_client, namespace):
    """An admin client, a fresh suspended TrainJob's name, and `toolkit ARGS`
    run on it through click's CliRunner with the plane's kubeconfig."""
    admin = kube.from_api_client(api_client)
    name = kit.create_trainjob(admin, namespace)["metadata"]["name"]
    runner = CliRunner()
    env = {"KUBECONFIG": control_plane.kubeconfig}

    def toolkit(*args: str):
        return runner.invoke(cli.root, [*args, "-n", namespace, name], env=env, prog_name="toolkit")

    return admin, name, toolkit


def test_open_open_again_hold_release_and_status_through_the_cli(control_plane, api_client, namespace):
    admin, name, toolkit = _suspended_trainjob(control_plane, api_client, namespace)

    opened = toolkit("open")
    assert (opened.exit_code, opened.stdout, opened.stderr) == (0, f"trainjob {namespace}/{name} running with A = 1\n", "")

    again = toolkit("open")  # already running: refused in one line, nothing written
    assert again.exit_code == 1 and again.stdout == ""
    assert again.stderr == (
        f"toolkit open: TrainJob {name}: spec.suspend is false; A is only raised while the TrainJob is suspended\n"
    )
    assert raising.counts(admin.get(paths.TRAINJOB, name=name, namespace=namespace)) == raising.Counts(patch=1, floor=1)

    held = toolkit("hold")
    assert (held.exit_code, held.stdout) == (0, f"trainjob {namespace}/{name} held\n")
    assert admin.get(paths.TRAINJOB, name=name, namespace=namespace)["spec"]["suspend"] is True
    held_again = toolkit("hold")
    assert (held_again.exit_code, held_again.stdout) == (0, f"trainjob {namespace}/{name} was already suspended\n")

    released = toolkit("release")
    assert (released.exit_code, released.stdout) == (0, f"trainjob {namespace}/{name} running with A = 2\n")
    tj = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert tj["spec"]["suspend"] is False
    assert raising.counts(tj) == raising.Counts(patch=2, floor=2)

    status = toolkit("status")
    assert (status.exit_code, status.stderr) == (0, "")
    # G 1, N 2 (kit's prefix 1000002), R = A + J = 2 + 0
    assert status.stdout.splitlines() == [
        f"trainjob                     {namespace}/{name}",
        "state                        running",
        "A (current execution)        2",
        "J (current execution)        0",
        "R (current execution)        2",
        "epoch (current execution)    1000002000002",
        "attempt (current execution)  job-1.2.0.2.0",
        "last A written               2",
        "floor                        2",
        "high-water R                 0",
        "jobset uid (recorded)        -",
        "jobset uid (seen)            -",
        "foreign                      no",
    ]
    held = toolkit("hold")
    assert held.exit_code == 0
    # Suspended: every row names the next execution, A included.
    lines = toolkit("status").stdout.splitlines()
    assert lines[2:7] == [
        "A (next execution)        3",
        "J (next execution)        0",
        "R (next execution)        3",
        "epoch (next execution)    1000002000003",
        "attempt (next execution)  job-1.2.0.3.0",
    ]


def test_release_waits_for_the_held_execution_s_pods_to_stop(control_plane, api_client, namespace):
    """Right after a hold the old pods still run; a raise then would leave
    them below the new floor, to be flagged foreign for nothing. Release is
    refused until they are finished or terminating (docs/adapter.md)."""
    admin, name, toolkit = _suspended_trainjob(control_plane, api_client, namespace)

    assert toolkit("open").exit_code == 0
    pods = [kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1") for _ in range(2)]
    pod_names = sorted(p["metadata"]["name"] for p in pods)
    assert toolkit("hold").exit_code == 0

    refused = toolkit("release")
    assert (refused.exit_code, refused.stdout) == (1, "")
    assert refused.stderr == (
        f"toolkit release: TrainJob {namespace}/{name}: pod {pod_names[0]} and 1 more of the held execution still running; "
        "release once the hold has stopped them (they would run below the raised floor)\n"
    )
    tj = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert tj["spec"]["suspend"] is True and raising.counts(tj) == raising.Counts(patch=1, floor=1)

    # One pod finished, the other terminating (held by a finalizer, as a
    # kubelet's grace period would): nothing judges them, release goes on.
    admin.merge_patch(paths.POD, {"status": {"phase": "Failed"}}, name=pod_names[0], namespace=namespace,
                      subresource="status")
    admin.merge_patch(paths.POD, {"metadata": {"finalizers": ["dispatch.phpboyscout.uk/test"]}},
                      name=pod_names[1], namespace=namespace)
    admin.delete(paths.POD, name=pod_names[1], namespace=namespace)
    try:
        released = toolkit("release")
        assert (released.exit_code, released.stdout) == (0, f"trainjob {namespace}/{name} running with A = 2\n")
    finally:
        admin.merge_patch(paths.POD, {"metadata": {"finalizers": None}}, name=pod_names[1], namespace=namespace)
