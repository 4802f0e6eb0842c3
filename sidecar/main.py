"""The sidecar's loop: check, report, wait; never a crash loop.

    podinfo.read ─► api GET TrainJob ─► (JobSet UID: pod label, else api GET JobSet)
        ─► check.violations ─► report.log every time, POST Event once per distinct violation
        ─► wait(interval, or backoff after a failed check) ─► again; SIGHUP cuts the wait short

Signals are handled here and only here, synchronously: SIGTERM, SIGINT and
SIGHUP are blocked and collected with sigtimedwait while waiting, and looked
at (sigpending) before every request. So a signal never interrupts a write
half-way, and it works as PID 1 of a container, where a signal with the
default action is dropped (blocked signals are not). SIGTERM or SIGINT: finish
the current step, exit 0.

Exit status: 0 after SIGTERM/SIGINT (or the test-only bound on checks), 2 for
bad settings. A violation, an unreachable apiserver, a malformed annotation or
a missing TrainJob never ends the process: each is logged, and a failed check
is retried with exponential backoff and jitter (a native sidecar that exits is
restarted by the kubelet, which would only turn a fault into a crash loop).
"""

from __future__ import annotations

import os
import signal
import sys
import time

from sidecar import api, check, podinfo, report, settings
from toolkit import backoff, names, paths

_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


class _CheckFailed(Exception):
    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _fraction() -> float:
    return int.from_bytes(os.urandom(4), "big") / 2**32


class Verifier:
    """State across checks: what was reported, the request count."""

    def __init__(self, config: settings.Settings) -> None:
        self.config = config
        self.reported = report.Reported()
        self.requests = 0
        self.checks = 0

    def _on_request(self, method: str, path: str, status: int | None, ms: float, error: str) -> None:
        self.requests += 1
        fields: dict[str, object] = {"method": method, "path": path, "status": status,
                                     "ms": round(ms, 1), "n": self.requests, "check": self.checks + 1}
        if error:
            fields["error"] = error
        report.log("request", level="info" if not error else "warning", **fields)

    def check(self) -> list[str]:
        """One check; returns the rules broken. Raises _CheckFailed or api.Stopping."""
        started = time.monotonic()
        try:
            pod = podinfo.read(self.config.podinfo_dir)
        except podinfo.PodInfoError as e:
            raise _CheckFailed(f"pod info: {e}") from None
        trainjob_name = pod.labels.get(names.JOBSET_NAME_LABEL)
        if not trainjob_name:
            # Trainer names the JobSet like the TrainJob; without the label this
            # is not a JobSet pod, and there is no TrainJob to report on.
            raise _CheckFailed(f"pod {pod.name} has no label {names.JOBSET_NAME_LABEL}: cannot find its TrainJob")
        session = api.Session(self.config.endpoint, timeout=self.config.timeout_seconds,
                              on_request=self._on_request)
        try:
            with session:
                trainjob = session.get(paths.TRAINJOB.path(namespace=pod.namespace, name=trainjob_name))
                # The pod's own JobSet UID label (JobSet sets it) saves the second read.
                jobset_uid = pod.labels.get(names.JOBSET_UID_LABEL) or self._jobset_uid(session, pod.namespace,
                                                                                   trainjob_name)
                reads = session.requests
                seen = check.seen_from(pod_name=pod.name, labels=pod.labels, annotations=pod.annotations,
                                       trainjob=trainjob, jobset_uid=jobset_uid)
                found = check.violations(seen)
                reported = 0
                for violation in found:
                    text = check.message(violation, seen)
                    report.log("violation", level="warning", rule=violation.rule, detail=text,
                               trainjob=trainjob_name, namespace=pod.namespace)
                    if self.reported.is_new(violation):
                        session.post(paths.EVENT.path(namespace=pod.namespace),
                                     report.event(namespace=pod.namespace, trainjob=trainjob, pod=pod.name,
                                                  message=text))
                        self.reported.add(violation)
                        reported += 1
        except api.ApiError as e:
            raise _CheckFailed(str(e), retry_after=e.retry_after) from None
        self.checks += 1
        report.log("verdict", verdict="violation" if found else "ok", rules=[v.rule for v in found],
                   pod=pod.name, trainjob=trainjob_name, namespace=pod.namespace, check=self.checks,
                   reads=reads, events=reported, api_ms=round(session.api_seconds * 1000, 1),
                   check_ms=round((time.monotonic() - started) * 1000, 1))
        return [v.rule for v in found]

    def _jobset_uid(self, session: api.Session, namespace: str, name: str) -> str | None:
        try:
            jobset = session.get(paths.JOBSET.path(namespace=namespace, name=name))
        except api.Unavailable:
            raise
        except api.ApiError as e:
            if e.status != 404:
                raise
            report.log("jobset not found: the UID rule is skipped this check", level="warning",
                       jobset=name, namespace=namespace)
            return None
        meta = jobset.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        return uid if isinstance(uid, str) and uid else None


def _wait(seconds: float) -> int | None:
    """The signal that arrived within `seconds`, or None."""
    info = signal.sigtimedwait(_SIGNALS, max(seconds, 0.0))
    return info.si_signo if info is not None else None


def run(config: settings.Settings) -> int:
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    verifier = Verifier(config)
    endpoint = config.endpoint
    report.log("start", pid=os.getpid(), api=f"{endpoint.host}:{endpoint.port}", credentials=endpoint.source,
               podinfo=config.podinfo_dir, interval_seconds=config.interval_seconds)
    failures = 0
    started = not config.started_file
    while True:
        try:
            verifier.check()
            failures = 0
            delay = config.interval_seconds
        except api.Stopping:
            # The pending signal is taken here, so the log names it whichever
            # moment it arrived in (during a check or during the wait).
            signo = _wait(0)
            reason = signal.Signals(signo).name if signo is not None else "signal"
            report.log("stop", reason=reason, checks=verifier.checks, requests=verifier.requests)
            return 0
        except (_CheckFailed, Exception) as e:
            # Exception too, deliberately: a bug must cost a logged retry, not
            # a crash loop of the pod's sidecar.
            failures += 1
            retry_after = e.retry_after if isinstance(e, _CheckFailed) else None
            # Every pod of a job may get the same 429 at the same moment: the
            # jitter (Retry-After's too) keeps them from all coming back at once.
            delay = backoff.delay(failures, base=config.backoff_base_seconds, cap=config.backoff_max_seconds,
                                  retry_after=retry_after, fraction=_fraction())
            error = str(e) if isinstance(e, _CheckFailed) else f"internal error: {type(e).__name__}: {e}"
            report.log("check failed", level="error", error=error, failures=failures,
                       retry_in_seconds=round(delay, 2))
        if not started:
            # After the first check, passed or failed: the trainer waits for the check to have
            # run, never for a verdict (an unreachable apiserver must not hold training back).
            started = _mark_started(config.started_file)
        if config.max_checks and verifier.checks >= config.max_checks:
            report.log("stop", reason="max checks", checks=verifier.checks, requests=verifier.requests)
            return 0
        signo = _wait(delay)
        if signo == signal.SIGHUP:
            report.log("re-check on SIGHUP")
        elif signo is not None:
            report.log("stop", reason=signal.Signals(signo).name, checks=verifier.checks,
                       requests=verifier.requests)
            return 0


def _mark_started(path: str) -> bool:
    try:
        # Bytes: the sidecar image carries only the codecs its imports load, and a text file would
        # look one up here, after the first check (LookupError, a crash loop on the real kubelet).
        with open(path, "wb") as f:
            f.write(b"1\n")
    except OSError as e:
        report.log("cannot mark the first check done", level="error", file=path, error=str(e))
        return False
    report.log("first check done", file=path)
    return True


def started(env: dict[str, str]) -> int:
    """The startupProbe: 0 once the first check has run (its file exists), else 1."""
    path = env.get(names.SIDECAR_STARTED_ENV) or names.SIDECAR_STARTED_FILE
    return 0 if os.path.exists(path) else 1


def main() -> int:
    try:
        config = settings.from_env()
    except settings.SettingsError as e:
        sys.stderr.write(f"dispatch-sidecar: {e}\n")
        return 2
    return run(config)
