"""Death reports: tell the backend about a driver that died without saying so.

When a driver Job fails (its pod OOMKilled, evicted, deleted, lost with its
node), is deleted before it finished, or its driver container never started
within the start deadline ("stuck": the image never pulled, see `starts`),
the driver could not report; the dispatcher sends `POST /jobs/{id}/status` with the per-job
token (read back from the Job's Secret when this process did not claim it).

`describe` is pure: from the Job, its pods, its Events and the log tail (or
why there is none) it builds the body. The container's own exit code is
kept as it is (137 stays 137); a missing log is said in the report, not
fatal. `gather` does the reads, each one best-effort: a report with less
detail is better than no report.

Outcomes: accepted, 404 (unknown run) and 409 (already terminal: the driver
did report, or an earlier dispatcher did) are done; 5xx, 429 and timeouts
are retried by the main loop with backoff; another 4xx is logged and dropped.
After a restart a failed Job still present is reported again, and the
backend's 409 makes that idempotent: the dispatcher keeps no state.

A report never carries a token. The driver's log tail and its termination
message are the driver's own words, and a driver may print its token (an
HTTP library's error quoting its header): `describe` redacts every token
this process holds (`logs.hold`: the service token, the run's own token
and every other run's) from the log tail before it is cut to
`MAX_LOG_CHARS` (so no token is cut in two and half kept), then from the
whole body; `backend.report` scrubs the run's token and the service token
once more just before sending. A token read back from a Secret is checked
like one from a claim (`backend.token_problem`): one that is not a bearer
token is not used (logged, never quoted). The kubelet keeps at most 4096
bytes of a termination message, so a token it cut there cannot be matched:
a driver should not print its token at all.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterable
from typing import Any

from dispatcher import backend, logs, names
from toolkit import kube, paths

log = logging.getLogger("dispatcher.reporter")

Obj = dict[str, Any]

MAX_EVENTS = 10
MAX_LOG_CHARS = 64 * 1024


def _stamp(obj: Obj) -> str:
    return str(obj.get("lastTimestamp") or obj.get("eventTime") or
               (obj.get("metadata") or {}).get("creationTimestamp") or "")


def latest_pod(pods: list[Obj]) -> Obj | None:
    return max(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""), default=None)


def container_state(pod: Obj | None) -> dict[str, Any]:
    """Reason, exit code and message of the driver container, as the kubelet recorded them."""
    if pod is None:
        return {}
    status = pod.get("status") or {}
    out: dict[str, Any] = {}
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") != names.DRIVER_CONTAINER:
            continue
        for where in ("state", "lastState"):
            terminated = (cs.get(where) or {}).get("terminated")
            if terminated:
                out["reason"] = terminated.get("reason")
                out["exit_code"] = terminated.get("exitCode")
                if terminated.get("signal") is not None:
                    out["signal"] = terminated.get("signal")
                if terminated.get("message"):
                    out["message"] = terminated.get("message")
                break
        else:
            waiting = (cs.get("state") or {}).get("waiting")
            if waiting:
                out["reason"] = waiting.get("reason")
                if waiting.get("message"):
                    out["message"] = waiting.get("message")
    # A pod-level reason (Evicted, DeadlineExceeded, NodeLost) says more than a missing container status.
    if status.get("reason") and not out.get("reason"):
        out["reason"] = status.get("reason")
    if status.get("message") and not out.get("message"):
        out["message"] = status.get("message")
    return out


def job_failure(job: Obj | None) -> dict[str, Any]:
    for condition in ((job or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Failed" and condition.get("status") == "True":
            return {"reason": condition.get("reason"), "message": condition.get("message")}
    return {}


def summarize_events(events: list[Obj]) -> list[dict[str, Any]]:
    recent = sorted(events, key=_stamp)[-MAX_EVENTS:]
    return [{
        "object": f"{(e.get('involvedObject') or {}).get('kind')}/{(e.get('involvedObject') or {}).get('name')}",
        "type": e.get("type"), "reason": e.get("reason"), "message": e.get("message"),
        "count": e.get("count"), "time": _stamp(e),
    } for e in recent]


def describe(*, kind: str, job_name: str, job: Obj | None, pod: Obj | None, events: list[Obj],
             log_tail: str | None, log_error: str | None, start_deadline: float | None = None,
             secrets: Iterable[str] = ()) -> dict[str, Any]:
    """The status body for a dead driver, with every held token and each of `secrets` redacted."""
    secrets = tuple(secrets)
    container = container_state(pod)
    failure = job_failure(job)
    if kind == "vanished":
        reason, message = "DriverJobDeleted", "the driver Job was deleted before it finished"
    elif kind == "stuck":
        # The kubelet's own words: ImagePullBackOff and its "Back-off pulling image ..." message.
        reason = container.get("reason") or "DriverNotStarted"
        message = container.get("message") or f"the driver container did not start within {start_deadline}s"
    else:
        reason = container.get("reason") or failure.get("reason") or "DriverFailed"
        message = container.get("message") or failure.get("message") or "the driver Job failed"
    error: dict[str, Any] = {
        "source": names.COMPONENT,
        "reason": reason,
        "message": message,
        "exit_code": container.get("exit_code"),
        "job": job_name,
        "pod": (pod or {}).get("metadata", {}).get("name"),
        "job_condition": failure or None,
        "events": summarize_events(events),
    }
    if kind == "stuck":
        error["start_deadline_seconds"] = start_deadline
    if container.get("signal") is not None:
        error["signal"] = container["signal"]
    if log_tail is not None:
        error["log_tail"] = logs.redact(log_tail, secrets=secrets)[-MAX_LOG_CHARS:]
    else:
        error["log_tail"] = None
        error["log_error"] = f"no log could be read: {log_error}"
    body = logs.scrub({"status": "failed", "error": error}, secrets=secrets)
    assert isinstance(body, dict)
    return body


def token_from_secret(secret: Obj) -> str | None:
    """The per-job token a Secret holds; None for none, or for one that is not a bearer token."""
    data = (secret.get("data") or {}).get(names.TOKEN_KEY)
    if not data:
        return None
    try:
        token = base64.b64decode(data).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    logs.hold(token)
    problem = backend.token_problem(token)
    if problem:
        log.error("the token in the job's Secret is not a bearer token; it is not used",
                  extra=logs.fields(secret=(secret.get("metadata") or {}).get("name"), why=f"the token {problem}"))
        return None
    return token


def gather(client: kube.Client, *, namespace: str, kind: str, job_name: str, job: Obj | None,
           tail_lines: int, start_deadline: float | None = None, secrets: Iterable[str] = ()) -> dict[str, Any]:
    """Read what the report needs, each read best-effort (the reads are the I/O half of `describe`)."""
    pod: Obj | None = None
    events: list[Obj] = []
    log_tail: str | None = None
    log_error: str | None = "the driver pod is gone"
    if kind in ("failed", "stuck"):
        try:
            pod = latest_pod(list(client.each(paths.POD, namespace=namespace,
                                              label_selector=f"{names.JOB_NAME_LABEL}={job_name}")))
        except kube.ApiError as e:
            log_error = f"the driver pod could not be listed: {e}"
        if pod is not None and kind == "stuck":
            log_error = "the driver container never started"
        elif pod is not None:
            pod_name = pod["metadata"]["name"]
            if tail_lines > 0:
                try:
                    text = client.read_log(namespace=namespace, pod=pod_name, container=names.DRIVER_CONTAINER,
                                           tail_lines=tail_lines)
                    if text:
                        log_tail, log_error = text, None
                    else:
                        where = (pod.get("spec") or {}).get("nodeName")
                        log_error = f"the log of pod {pod_name} is empty" + (
                            "" if where else " (the pod was never bound to a node)")
                except kube.ApiError as e:
                    log_error = str(e)
            else:
                log_error = "TCAB_DISPATCHER_LOG_TAIL_LINES is 0"
        selectors = [f"involvedObject.kind=Job,involvedObject.name={job_name}"]
        if pod is not None:
            selectors.append(f"involvedObject.kind=Pod,involvedObject.name={pod['metadata']['name']}")
        for field_selector in selectors:
            try:
                events.extend(client.each(paths.EVENT, namespace=namespace, field_selector=field_selector))
            except kube.ApiError:
                pass  # the report goes without them
    return describe(kind=kind, job_name=job_name, job=job, pod=pod, events=events,
                    log_tail=log_tail, log_error=log_error, start_deadline=start_deadline, secrets=secrets)
