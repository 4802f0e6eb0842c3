"""The backend client: the claim and the status report, nothing else.

Contract (seed 002; the reference backend in `refbackend/` implements it):
- `POST /jobs/next` with `Authorization: Bearer <service token>`: 200 and
  `{"id", "token", "launch_request", ...}` for a claimed run, 204 when
  nothing is claimable. The backend makes the claim atomic and applies the
  per-harness limits; a claimed run the dispatcher never started is offered
  again later (the Job name is deterministic, so that is an AlreadyExists).
- `POST /jobs/{id}/status` with the per-job token: 2xx accepted; 404 unknown
  run and 409 already terminal are final answers (done, never retried); 5xx,
  429 and timeouts are retryable; any other 4xx is a final refusal.
- A 429 or 503 may carry `Retry-After` (seconds or an HTTP date): the retry
  waits at least that long (at most `MAX_RETRY_AFTER`, so a wrong header
  cannot park the dispatcher for a day).

The tokens travel only in the Authorization header and are never logged:
`Claim.token` is excluded from its repr.
"""

from __future__ import annotations

import dataclasses
import email.utils
import enum
import json
import math
import time
import urllib.parse
from typing import Any

import urllib3

from dispatcher import names


MAX_RETRY_AFTER = 600.0


def retry_after(value: str | None, *, now: float) -> float | None:
    """Seconds to wait from a `Retry-After` header (delta-seconds or an HTTP date), or None if absent/unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - now
    if math.isnan(seconds):
        return None
    return min(MAX_RETRY_AFTER, max(0.0, seconds))


class BackendError(Exception):
    """The backend could not be reached or answered 5xx/429: retry later (not before `retry_after`)."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BackendRefused(Exception):
    """A 4xx on the claim (bad service token, bad request): an operator must act."""


@dataclasses.dataclass(frozen=True)
class Claim:
    job_id: str
    token: str = dataclasses.field(repr=False)
    launch_request: Any
    harness: str = ""


class Outcome(enum.Enum):
    ACCEPTED = "accepted"
    UNKNOWN = "unknown"  # 404: the backend does not know the run
    TERMINAL = "terminal"  # 409: the run already has a terminal state
    REFUSED = "refused"  # another 4xx: final, logged as an error
    RETRY = "retry"  # 5xx, 429, timeout, connection error


@dataclasses.dataclass(frozen=True)
class Answer:
    """What a status report came to."""

    outcome: Outcome
    status: int  # the HTTP status, 0 if there was no answer
    retry_after: float | None = None


def _retry_after(response: urllib3.BaseHTTPResponse) -> float | None:
    return retry_after(response.headers.get("Retry-After"), now=time.time())


class Backend:
    def __init__(self, *, url: str, service_token: str, timeout: float, pool_size: int = 8) -> None:
        self.url = url.rstrip("/")
        self._service_token = service_token
        self._http = urllib3.PoolManager(
            maxsize=pool_size, block=False, retries=False,
            timeout=urllib3.Timeout(connect=timeout, read=timeout),
        )
        self.requests = 0

    def close(self) -> None:
        self._http.clear()

    def _post(self, path: str, *, token: str, body: Any | None) -> urllib3.BaseHTTPResponse:
        self.requests += 1
        return self._http.request(
            "POST", self.url + path,
            body=json.dumps(body).encode() if body is not None else b"",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )

    def claim(self) -> Claim | None:
        """One atomic claim; None when the backend has nothing for us."""
        try:
            response = self._post(names.CLAIM_PATH, token=self._service_token, body={})
        except urllib3.exceptions.HTTPError as e:
            raise BackendError(f"claim: {type(e).__name__}: {e}") from None
        status = response.status
        if status == 204:
            return None
        if status == 429 or status >= 500:
            raise BackendError(f"claim: HTTP {status}", retry_after=_retry_after(response))
        if status != 200:
            raise BackendRefused(f"claim: HTTP {status}: {response.data[:200].decode(errors='replace')}")
        try:
            data = json.loads(response.data)
            job_id = str(data["id"])
            token = str(data["token"])
        except (ValueError, KeyError, TypeError):
            raise BackendError("claim: the 200 answer is not a run ({id, token, launch_request})") from None
        if not job_id or not token:
            raise BackendError("claim: the 200 answer has an empty id or token")
        return Claim(job_id=job_id, token=token, launch_request=data.get("launch_request"),
                     harness=str(data.get("harness") or ""))

    def report(self, *, job_id: str, token: str, body: dict[str, Any]) -> Answer:
        """Send a status; what it came to."""
        path = names.STATUS_PATH.format(id=urllib.parse.quote(job_id, safe=""))
        try:
            response = self._post(path, token=token, body=body)
        except urllib3.exceptions.HTTPError:
            return Answer(Outcome.RETRY, 0)
        status = response.status
        if 200 <= status < 300:
            return Answer(Outcome.ACCEPTED, status)
        if status == 404:
            return Answer(Outcome.UNKNOWN, status)
        if status == 409:
            return Answer(Outcome.TERMINAL, status)
        if status == 429 or status >= 500:
            return Answer(Outcome.RETRY, status, _retry_after(response))
        return Answer(Outcome.REFUSED, status)
