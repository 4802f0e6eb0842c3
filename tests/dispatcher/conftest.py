"""The dispatcher's cluster tests run on the local cluster's real node, the dispatcher as the
release's pod.

`dispatcher_cluster` is one node cluster shared by every module of this package
(`tests.conftest.a_node_cluster`) with the release installed as a user installs it
(devcluster/install.py: the images pushed to the cluster's registry, the bundle rendered; no
controller.yaml, as there is no Kueue here). Every test works in a namespace of its own
(`namespace`), so the modules need no cluster each, and the apiserver a test stops it starts again.
`rbac_kubeconfig` installs the release's dispatcher.yaml into the test's namespace as an overlay
would (devcluster/dispatcher_pod.py: its ServiceAccount, Role, RoleBinding and Deployment, at zero
replicas) and mints a kubeconfig for its ServiceAccount. `control_plane`, `namespace` and
`api_client` follow the cluster, so every dispatcher pod and every driver pod it creates is started,
run and ended by the real kubelet (containerd, runc), and `pods/log` and `pods/exec` go to it.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from devcluster import dispatcher_pod, harness
from devcluster import stack as stack_mod
from tests.conftest import a_node_cluster


@pytest.fixture(scope="package")
def dispatcher_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack_mod.Stack]:
    release: pathlib.Path = tmp_path_factory.mktemp("release")
    with a_node_cluster(release_dir=release, release_controller=False) as running:
        yield running


@pytest.fixture(scope="module")
def control_plane(dispatcher_cluster: stack_mod.Stack) -> harness.ControlPlane:
    return dispatcher_cluster.plane


@pytest.fixture(scope="package")
def released(dispatcher_cluster: stack_mod.Stack) -> dispatcher_pod.Released:
    """What the release's dispatcher.yaml installs."""
    return dispatcher_pod.Released(dispatcher_cluster.installed.release.files[dispatcher_pod.PART].read_text())


@pytest.fixture
def driver_image(released: dispatcher_pod.Released) -> str:
    """The release's test driver, as dispatcher.yaml names it (pulled from the cluster's registry)."""
    return released.driver_image


@pytest.fixture
def rbac_kubeconfig(dispatcher_cluster: stack_mod.Stack, control_plane: harness.ControlPlane, namespace: str) -> str:
    """The release's dispatcher.yaml installed into NAMESPACE; a kubeconfig of its ServiceAccount."""
    installed = dispatcher_pod.install(dispatcher_cluster, dispatcher_cluster.installed.release, namespace)
    return str(control_plane.mint_kubeconfig(namespace=namespace, service_account=installed.service_account))
