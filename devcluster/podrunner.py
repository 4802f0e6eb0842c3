"""The kubelet's other half for `toolkit cluster up`: run every pod kwok marks
Running, for real, in podman, and end it with its container's exit code.

kwok only writes pod status; the demo and the e2e tests run each pod's
container themselves (they check what it printed). On a cluster a person
starts with `toolkit cluster up`, this process does that for every pod: it
watches pods in every namespace that are Running on a node and carry no exit
code yet, runs their containers with podman the way `execute.run` does
(the pod's own environment, Downward API values, $(VAR) expansion, hostPath
volumes; no network), and writes the exit code into the annotation our kwok
stage turns into the container's termination (Succeeded for 0, Failed
otherwise). A pod's containers run side by side, as a kubelet runs them; the
pod's code is the first non-zero one in container order, else 0. Native
sidecars (init containers with restartPolicy Always) are not run: they live
as long as the pod, and here the pod ends with its main containers.

What each container printed goes to `<log dir>/pods/<namespace>_<pod>_<container>.log`.
A pod that cannot be run here (an env source or volume kind the resolver does
not implement, a missing image) fails with exit code 128, reason
`ExecutorError`, and the cause in the log file: never left Running for ever.

Invariants: each pod is run at most once per process (by uid); the watch
resumes from its last resourceVersion and relists after an error or a 410, so
a pod that became Running while the watch was down is still found.

Run: python -m devcluster.podrunner --kubeconfig FILE --log-dir DIR [--workers N]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import pathlib
import sys
import threading
import time
from typing import Any

import kubernetes.client
import kubernetes.config
import kubernetes.watch
import urllib3.exceptions

from devcluster import execute, stack as stack_mod

EXECUTOR_ERROR = 128


class Runner:
    def __init__(self, api: kubernetes.client.ApiClient, log_dir: pathlib.Path, *, workers: int) -> None:
        self.api = api
        self.core = kubernetes.client.CoreV1Api(api)
        self.log_dir = log_dir
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pod")
        self.started: set[str] = set()
        self.lock = threading.Lock()

    def wants(self, pod: dict[str, Any]) -> bool:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        return (status.get("phase") == "Running" and bool(spec.get("nodeName"))
                and not meta.get("deletionTimestamp")
                and stack_mod.EXIT_CODE_ANNOTATION not in (meta.get("annotations") or {}))

    def offer(self, pod: dict[str, Any]) -> None:
        if not self.wants(pod):
            return
        with self.lock:
            uid = pod["metadata"]["uid"]
            if uid in self.started:
                return
            self.started.add(uid)
        self.pool.submit(self.run, pod)

    def run(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        names = [c["name"] for c in pod["spec"]["containers"]]
        reason = None
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(names)) as side_by_side:
            futures = {n: side_by_side.submit(execute.run, pod, container_name=n, timeout=3600) for n in names}
            codes = []
            for name, future in futures.items():
                path = self.log_dir / f"{meta['namespace']}_{meta['name']}_{name}.log"
                try:
                    ran = future.result()
                    path.write_text(ran.stdout + ran.stderr)
                    codes.append(ran.exit_code)
                    if ran.exit_code == 125 and "image not known" in ran.stderr:
                        reason = "ExecutorError"
                except (execute.ResolveError, execute.Timeout, OSError) as e:
                    path.write_text(f"podrunner: cannot run this container here: {e}\n")
                    codes.append(EXECUTOR_ERROR)
                    reason = "ExecutorError"
        code = next((c for c in codes if c != 0), 0)
        annotations = {stack_mod.EXIT_CODE_ANNOTATION: str(code)}
        if reason:
            annotations[stack_mod.EXIT_REASON_ANNOTATION] = reason
        try:
            self.core.patch_namespaced_pod(meta["name"], meta["namespace"], {"metadata": {"annotations": annotations}})
        except kubernetes.client.ApiException as e:
            if e.status != 404:  # a pod deleted meanwhile has nothing left to end
                raise
        print(f"podrunner: {meta['namespace']}/{meta['name']} exited {code}", flush=True)

    def watch_forever(self) -> None:
        version = ""
        while True:
            try:
                if not version:
                    listed = self.core.list_pod_for_all_namespaces(field_selector="status.phase=Running")
                    for pod in listed.items:
                        self.offer(self.api.sanitize_for_serialization(pod))
                    version = listed.metadata.resource_version
                stream = kubernetes.watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces, resource_version=version, timeout_seconds=60,
                    allow_watch_bookmarks=True)
                for event in stream:
                    obj = event["raw_object"]
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.offer(obj)
            except kubernetes.client.ApiException as e:
                if e.status == 410:
                    version = ""  # too old: relist
                    continue
                print(f"podrunner: watch failed ({e.status} {e.reason}); relisting", flush=True)
                version = ""
                time.sleep(1)
            except (urllib3.exceptions.HTTPError, OSError) as e:
                print(f"podrunner: watch failed ({e}); relisting", flush=True)
                version = ""
                time.sleep(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster.podrunner")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--log-dir", required=True, type=pathlib.Path)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args(argv)
    if not 1 <= args.workers <= 64:
        parser.error("--workers: expected a whole number from 1 to 64")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    api = kubernetes.config.new_client_from_config(config_file=args.kubeconfig)
    print("podrunner: running pods in podman", flush=True)
    Runner(api, args.log_dir, workers=args.workers).watch_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
