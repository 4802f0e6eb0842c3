"""The local cluster: a real control plane and the real controllers, as local processes.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler (`harness`),
the real Kubeflow Trainer, JobSet and Kueue controller managers with their
webhooks and kwok (`stack`; our controller is the release's, installed as its pods
on the real node: `install`, `local`), and the podman
executor that runs a scheduled pod's container in its image (`execute`). Each
binary is built from its own Go module into the user cache
(`build-controlplane.sh`, `build-controllers.sh`). `make demo`,
`toolkit cluster`, the tests and the benches all use this one copy.
"""
