"""The backend client: the claim and the status report, nothing else.

Contract (docs/dispatcher.md; the reference backend in `refbackend/` implements it):
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

Tokens are checked here, where they enter (`token_problem`): a bearer token
holds only the characters RFC 6750 allows (`b64token`: letters, digits,
`-._~+/`, then `=` padding) and at most `MAX_TOKEN_CHARS` of them. Anything
else could break or smuggle a header (a newline makes the HTTP library raise
an error quoting the whole `Authorization` header) or hide in escaped form
from a string match. A claimed run whose token fails the check is refused:
no Job is made for it, and the refusal is reported (`POST /jobs/{id}/status`,
failed, reason `InvalidJobToken`) authenticated with the service token,
since the run's own token may never be placed in a header; `claim` then
raises `TokenRefused` (a `BackendError`: the loop claims again after a short
pause). The reference backend takes the service token for any run's report; a
backend that accepts status reports only with the per-job token answers that
report 401, which is logged; the run stays claimed until its lease runs out,
then is offered and refused again.

The tokens travel only in the Authorization header and are never logged:
`Claim.token` is excluded from its repr, every token is registered with
`logs.hold` as it enters (so a log record that would carry it is redacted),
and a status body is scrubbed of the run's token and the service token
before it is sent.
"""

from __future__ import annotations

import dataclasses
import enum
import http.client
import json
import logging
import re
import urllib.parse
from typing import Any

import urllib3

from dispatcher import logs, names
from toolkit import backoff

log = logging.getLogger("dispatcher.backend")

MAX_RETRY_AFTER = 600.0
MAX_TOKEN_CHARS = 4096
_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
TOKEN_RULE = f"RFC 6750 bearer token: 1..{MAX_TOKEN_CHARS} of A-Z a-z 0-9 - . _ ~ + / then = padding"


def token_problem(token: object) -> str | None:
    """Why `token` may not be used as a bearer token (never quoting it), or None if it may."""
    if not isinstance(token, str) or not token:
        return "is empty or not a string"
    if len(token) > MAX_TOKEN_CHARS:
        return f"is {len(token)} characters long, more than {MAX_TOKEN_CHARS}"
    if not _B64TOKEN.fullmatch(token):
        return f"holds a character outside an {TOKEN_RULE}"
    return None


class BackendError(Exception):
    """The backend could not be reached or answered 5xx/429: retry later (not before `retry_after`)."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BackendRefused(Exception):
    """A 4xx on the claim (bad service token, bad request): an operator must act."""


class TokenRefused(BackendError):
    """The claimed run's token is not a bearer token: the run was refused (and that reported), not started."""


class InvalidToken(ValueError):
    """A token that failed `token_problem` was about to be placed in a header (never sent)."""


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
    return backoff.retry_after(response.headers.get("Retry-After"), limit=MAX_RETRY_AFTER)


class Backend:
    def __init__(self, *, url: str, service_token: str, timeout: float, pool_size: int = 8) -> None:
        self.url = url.rstrip("/")
        problem = token_problem(service_token)
        if problem:
            raise InvalidToken(f"the service token {problem}")
        self._service_token = service_token
        logs.hold(service_token)
        self._http = urllib3.PoolManager(
            maxsize=pool_size, block=False, retries=False,
            timeout=urllib3.Timeout(connect=timeout, read=timeout),
        )
        self.requests = 0

    def close(self) -> None:
        self._http.clear()

    def _post(self, path: str, *, token: str, body: Any | None) -> urllib3.BaseHTTPResponse:
        if token_problem(token):
            raise InvalidToken("a token that is not a bearer token was not sent")
        self.requests += 1
        try:
            return self._http.request(
                "POST", self.url + path,
                body=json.dumps(body).encode() if body is not None else b"",
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
        except urllib3.exceptions.HTTPError:
            raise
        except (ValueError, UnicodeError, http.client.HTTPException) as e:
            # The library's own words may quote the headers: only the type goes on.
            raise urllib3.exceptions.HTTPError(f"the request could not be sent ({type(e).__name__})") from None

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
            raw_token = data["token"]
        except (ValueError, KeyError, TypeError):
            raise BackendError("claim: the 200 answer is not a run ({id, token, launch_request})") from None
        token = raw_token if isinstance(raw_token, str) else json.dumps(raw_token)
        logs.hold(token)  # before anything could quote it
        if not job_id:
            raise BackendError("claim: the 200 answer has an empty id")
        problem = token_problem(raw_token)
        if problem:
            answer = self._refuse(job_id, problem)
            log.error("run refused: its token is not a bearer token; not started", extra=logs.fields(
                job_id=job_id, why=f"the token {problem}", report_status=answer.status,
                report_outcome=answer.outcome.value))
            raise TokenRefused(f"claim: run {job_id} refused (its token {problem}); refusal reported: "
                               f"{answer.outcome.value} (HTTP {answer.status})", retry_after=0.0)
        return Claim(job_id=job_id, token=token, launch_request=data.get("launch_request"),
                     harness=str(data.get("harness") or ""))

    def _refuse(self, job_id: str, problem: str) -> Answer:
        """Report a run refused for its token, with the service token (the run's own is unusable)."""
        body = {"status": "failed", "error": {
            "source": names.COMPONENT, "reason": "InvalidJobToken",
            "message": f"the run's token {problem}: the dispatcher refused the run and never used the token"}}
        return self._send_status(job_id, token=self._service_token, body=body)

    def report(self, *, job_id: str, token: str, body: dict[str, Any]) -> Answer:
        """Send a status with the run's token (scrubbed of it and of the service token); what it came to.

        A token that is not a bearer token is never sent: REFUSED, HTTP status 0."""
        if token_problem(token):
            logs.hold(token)
            return Answer(Outcome.REFUSED, 0)
        clean = logs.scrub(body, secrets=(token, self._service_token))
        assert isinstance(clean, dict)
        return self._send_status(job_id, token=token, body=clean)

    def _send_status(self, job_id: str, *, token: str, body: dict[str, Any]) -> Answer:
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
