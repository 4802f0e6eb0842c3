"""The controller process: where its parts are wired together, the flow drawn once.

    apiserver
      │  list+watch (informer.Informer, one per kind; relist on 410)
      ▼
    AdmissionCheck ──► ours = {checks with spec.controllerName ours} ──► admission.ensure_active
    Workload ────────┐
    JobSet ──────────┤  handlers put (kind, ns, name) keys with the latest object
    Pod (trainer) ───┤  (each cache keeps only what is read: `views`)
    Event (sidecar) ─┘
      ▼
    queue.WorkQueue (dedup by key, one worker per key at a time)
      ▼
    workers ──► workload: admission.reconcile_workload  (raise A, then check Ready)
            ──► jobset:   detector.Detector.jobset       (record UID / flag a reset)
            ──► pod:      detector.Detector.pod          (missing or below-floor A)
            ──► event:    detector.Detector.event        (a sidecar's report)

The informers, the queue and the workers are one term's `reconcile.Controller`; this module
runs the process around it (`run`): the client, the metrics, the health and metrics servers,
and the leader election that starts a Controller for each term and stops it when the term ends.

Only the leader runs informers and workers (leader election on a Lease,
`leader.run_leader_election`); a standby is live (/healthz) and ready (/readyz:
it does its part, so rollouts and drains proceed), and only the synced leader
answers /leaderz 200 (`health`). The probes are plain HTTP on the health port; /metrics is HTTPS on
a port of its own, for callers the apiserver authenticates and authorizes
(`metrics_server`); the leader alone also watches the flagged TrainJobs, for
the flagged gauge (`metrics`). Losing the lease stops the leader's work (its workers finish
the step they are in, its informers stop) and the process campaigns again as a standby, with a
new `Controller` when it next leads; a worker still in its step after the grace period ends the
process instead (exit 1), so nothing acts on stale leadership either way. SIGTERM finishes the
current step and exits 0.

A leader that cannot renew steps down in time: its term ends at most the renew deadline after
the start of its last renewal that succeeded, even while a Lease call is blocked on a connection
that never answers (`leader.run_leader_election`: a watchdog beside the renew loop, and every Lease
call bounded by min(retry period, renew deadline / 2)). A standby takes the Lease a lease
duration after it last saw it renewed, so the lease duration minus the renew deadline (5 s by
default) is the margin in which the old leader's workers finish their step (the 2 s grace).

Settings come from the environment (DISPATCH_CONTROLLER_*), overridden by
the CLI's options; one table and one parser for both (`settings`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import uuid

import prometheus_client

from toolkit import clusterconfig, jsonlog, leader
from controller import certs, health, reconcile
from controller import metrics as metrics_mod
from controller import metrics_server as metrics_server_mod
from controller import settings as settings_mod

log = logging.getLogger("controller")
COMPONENT = "dispatch-controller"


# The settings live in their own module (one table, one parser); these
# names stay here for the process's callers.
Settings = settings_mod.Settings
SettingsError = settings_mod.SettingsError
env_var = settings_mod.env_var


class JsonFormatter(logging.Formatter):
    """The record all three processes write (toolkit.jsonlog); `extra` values are its fields,
    and a failure keeps its whole traceback (the controller's operators debug from these lines)."""

    def format(self, record: logging.LogRecord) -> str:
        return jsonlog.line(jsonlog.from_log_record(record, component=COMPONENT, traceback=True))


def setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    logging.getLogger("leaderelection").setLevel(logging.WARNING)


def run(settings: Settings) -> int:
    """The process: health server, leader election, the controller. Returns
    the exit status (0 after SIGTERM, 1 when a lost lease found a worker still in its step)."""
    setup_logging()
    client = clusterconfig.load(kubeconfig=settings.kubeconfig, context=settings.context)
    metrics = metrics_mod.Metrics(lease=settings.lease_name)
    metrics.api_requests_source = lambda: client.requests
    bounds = {"max_connections": settings.max_connections, "connection_seconds": settings.connection_seconds}
    server = health.HealthServer(host=settings.health_host, port=settings.health_port, **bounds)
    metrics_server = metrics_server_mod.MetricsServer(
        host=settings.metrics_host, port=settings.metrics_port, context=certs.server_context(settings.metrics_cert_dir),
        reviewer=metrics_server_mod.Reviewer(client, reviews_per_minute=settings.token_reviews_per_minute),
        scrape=metrics.scrape, content_type=prometheus_client.CONTENT_TYPE_LATEST, **bounds)
    server.start()
    metrics_server.start()
    server.live.set()
    done = threading.Event()
    status = {"code": 0}
    # The leader's work of the current term. A term ends with its lease (`lost`) and is never
    # resumed: the next term gets a new Controller. `guard` orders a term's start (`lead`, in the
    # election library's thread) against its end, so a term that ended before its lead() ran
    # starts nothing.
    guard = threading.Lock()
    current: dict[str, reconcile.Controller | None] = {"controller": None}

    def lead(ended: threading.Event) -> None:
        log.info("leading", extra={"lease": settings.lease_name})
        controller = reconcile.Controller(client, settings, metrics=metrics)
        with guard:
            if done.is_set() or ended.is_set():
                return
            current["controller"] = controller
            server.ready.clear()  # not ready until its informers have listed
            metrics.leader.set(1)
            controller.start()
        synced = controller.wait_synced(60)
        with guard:
            if synced and not ended.is_set():
                metrics.flagged_source = controller.flagged.items
                server.ready.set()
                server.leading.set()
                log.info("ready", extra={"port": server.port})
        controller.stop.wait()

    def lost(ended: threading.Event) -> None:
        with guard:
            ended.set()
            server.leading.clear()
            metrics.leader.set(0)
            metrics.flagged_source = None
            metrics.awaiting_ready.set_function(lambda: 0)  # a standby awaits nothing
            controller, current["controller"] = current["controller"], None
        if controller is not None and not controller.shutdown():
            log.error("lost the lease while a worker was still in its step, exiting")
            status["code"] = 1
            done.set()
            return
        log.warning("lost the lease, campaigning again")
        server.ready.set()  # a standby again

    # One identity for the process: a term that follows its own lost one finds the Lease still
    # naming it and takes it back at once, unless another replica took it meanwhile.
    identity = f"{os.environ.get('HOSTNAME', 'controller')}-{uuid.uuid4().hex[:8]}"

    def campaign() -> None:
        while not done.is_set():
            ended = threading.Event()
            leader.run_leader_election(
                client,
                lease_name=settings.lease_name,
                namespace=settings.lease_namespace,
                identity=identity,
                on_started=lambda: lead(ended),
                on_stopped=lambda: lost(ended),
                lease_duration=settings.lease_duration,
                renew_deadline=settings.renew_deadline,
                retry_period=settings.retry_period,
            )

    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    log.info("starting", extra={"health_host": settings.health_host, "health_port": server.port,
                                "metrics_host": settings.metrics_host, "metrics_port": metrics_server.port,
                                "leader_elect": settings.leader_elect})
    if settings.leader_elect:
        server.ready.set()  # a standby, campaigning for the Lease
        threading.Thread(target=campaign, name="leader-election", daemon=True).start()
    else:
        threading.Thread(target=lead, args=(threading.Event(),), name="lead", daemon=True).start()
    done.wait()
    log.info("stopping")
    with guard:
        server.ready.clear()
        server.leading.clear()
        controller, current["controller"] = current["controller"], None
    if controller is not None:
        controller.shutdown()
    metrics_server.stop()
    server.stop()
    return status["code"]
