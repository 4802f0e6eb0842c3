"""S3's multipart upload for dispatch_fence.s3, signed here (AWS Signature
Version 4) over the standard library's HTTP client: CreateMultipartUpload,
UploadPart, CompleteMultipartUpload with `If-None-Match: *`, AbortMultipartUpload
and ListMultipartUploads, nothing else.

Why it exists: a file above 5 GiB needs a multipart upload, and create-only
needs the precondition on the request that completes it. obstore 0.12.1 (which
makes every other S3 request of the fence) sends none on a multipart upload
(for a conditional put it falls back to one PutObject), and botocore cannot
share an environment with the toolkit's kubernetes client (python-dateutil
below 3 against 3 and above).

Configured from the environment as obstore is (docs/checkpoint.md,
Credentials): AWS_ENDPOINT_URL (path-style; AWS_ALLOW_HTTP=true for http://),
AWS_REGION; credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and
AWS_SESSION_TOKEN), else IRSA's AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE
(STS AssumeRoleWithWebIdentity), else the container credentials of EKS Pod
Identity or ECS, else the instance's metadata service (IMDSv2; not when
AWS_EC2_METADATA_DISABLED=true). Parts go unsigned (UNSIGNED-PAYLOAD) with a
Content-MD5 the store checks. A request is tried up to ATTEMPTS times on a
connection error, a timeout, 5xx or 429; a response says how often it was
retried, for the judgment of a retried create (dispatch_fence.transfer).
Imports nothing of the fence.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import http.client
import json
import os
import random
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

ATTEMPTS = 4
TIMEOUT = 120.0
RETRYABLE = (429, 500, 502, 503, 504)
_NS = re.compile(r"^\{[^}]*\}")


class S3Error(Exception):
    """A request that failed: STATUS (0: no response), the store's CODE and message, and how many
    times it was retried."""

    def __init__(self, status: int, code: str, message: str, *, retries: int = 0) -> None:
        self.status, self.code, self.retries = status, code, retries
        super().__init__(f"{status or 'no response'} {code}: {message}" + (f" (after {retries} retries)" if retries else ""))


@dataclass(frozen=True)
class Credentials:
    key: str
    secret: str
    token: str | None = None
    expires: float | None = None  # seconds since the epoch


def _xml(body: bytes) -> dict[str, str]:
    """Every leaf element of BODY by its name without namespace (the last one of each name)."""
    import xml.etree.ElementTree as ET

    out: dict[str, str] = {}
    for el in ET.fromstring(body).iter():
        if len(el) == 0:
            out[_NS.sub("", el.tag)] = el.text or ""
    return out


def _when(text: str | None) -> float | None:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def _get(url: str, *, method: str = "GET", headers: Mapping[str, str] | None = None, data: bytes | None = None,
         timeout: float = 5.0) -> bytes:
    req = urllib.request.Request(url, method=method, headers=dict(headers or {}), data=data)
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (URLs from the environment)
        return bytes(r.read())


class Chain:
    """The credentials of the environment, resolved once and again when they are about to expire."""

    def __init__(self, env: Mapping[str, str], region: str) -> None:
        self._env, self._region = env, region
        self._lock = threading.Lock()
        self._cached: Credentials | None = None

    def get(self) -> Credentials:
        with self._lock:
            c = self._cached
            if c is None or (c.expires is not None and c.expires - time.time() < 300):
                c = self._cached = self._resolve()
            return c

    def _resolve(self) -> Credentials:
        env = self._env
        try:
            if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
                return Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], env.get("AWS_SESSION_TOKEN"))
            if env.get("AWS_WEB_IDENTITY_TOKEN_FILE") and env.get("AWS_ROLE_ARN"):
                return self._web_identity()
            if env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") or env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
                return self._container()
            if env.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true":
                return self._instance()
        except (OSError, ValueError, KeyError) as exc:
            raise S3Error(0, "NoCredentials", f"{type(exc).__name__}: {exc}") from None
        raise S3Error(0, "NoCredentials", "no credentials in the environment (AWS_ACCESS_KEY_ID, IRSA, "
                                          "Pod Identity) and the instance metadata service is disabled")

    def _web_identity(self) -> Credentials:
        env = self._env
        with open(env["AWS_WEB_IDENTITY_TOKEN_FILE"]) as f:
            token = f.read().strip()
        sts = env.get("AWS_ENDPOINT_URL_STS") or f"https://sts.{self._region}.amazonaws.com"
        form = urllib.parse.urlencode({"Action": "AssumeRoleWithWebIdentity", "Version": "2011-06-15",
                                       "RoleArn": env["AWS_ROLE_ARN"], "WebIdentityToken": token,
                                       "RoleSessionName": env.get("AWS_ROLE_SESSION_NAME", "dispatch-fence")})
        got = _xml(_get(sts.rstrip("/") + "/", method="POST", data=form.encode(), timeout=30,
                        headers={"Content-Type": "application/x-www-form-urlencoded"}))
        return Credentials(got["AccessKeyId"], got["SecretAccessKey"], got.get("SessionToken"), _when(got.get("Expiration")))

    def _container(self) -> Credentials:
        env = self._env
        url = env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") or \
            "http://169.254.170.2" + env["AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"]
        token = env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN")
        if env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"):
            with open(env["AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"]) as f:
                token = f.read().strip()
        got = json.loads(_get(url, headers={"Authorization": token} if token else {}))
        return Credentials(got["AccessKeyId"], got["SecretAccessKey"], got.get("Token"), _when(got.get("Expiration")))

    def _instance(self) -> Credentials:
        base = (self._env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or self._env.get("AWS_METADATA_ENDPOINT")
                or "http://169.254.169.254").rstrip("/")
        token = _get(f"{base}/latest/api/token", method="PUT", timeout=2,
                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "21600"}).decode()
        auth = {"X-aws-ec2-metadata-token": token}
        where = f"{base}/latest/meta-data/iam/security-credentials/"
        role = _get(where, headers=auth, timeout=2).decode().split()[0]
        got = json.loads(_get(where + role, headers=auth, timeout=2))
        return Credentials(got["AccessKeyId"], got["SecretAccessKey"], got.get("Token"), _when(got.get("Expiration")))


def _quote(text: str, safe: str = "-_.~") -> str:
    return urllib.parse.quote(text, safe=safe)


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    retries: int


class Client:
    """The multipart requests on one bucket; thread-safe (a connection per thread)."""

    def __init__(self, bucket: str, env: Mapping[str, str] | None = None) -> None:
        env = dict(os.environ if env is None else env)  # read once, as obstore reads it
        self.region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT")
        if endpoint:
            url = urllib.parse.urlsplit(endpoint)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise S3Error(0, "BadEndpoint", f"the endpoint {endpoint!r} is not an http(s) URL")
            if url.scheme == "http" and env.get("AWS_ALLOW_HTTP", "").lower() != "true":
                raise S3Error(0, "BadEndpoint", f"the endpoint {endpoint} is http:// and AWS_ALLOW_HTTP is not true")
            self.https, self.host = url.scheme == "https", url.netloc
            self.base = url.path.rstrip("/") + "/" + _quote(bucket)
        else:
            self.https, self.host, self.base = True, f"{bucket}.s3.{self.region}.amazonaws.com", ""
        self.credentials = Chain(env, self.region)
        self._local = threading.local()

    # -- one request ----------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            conn = self._local.conn = kind(self.host, timeout=TIMEOUT)
        return conn  # type: ignore[no-any-return]

    def _signed(self, method: str, path: str, query: list[tuple[str, str]], headers: dict[str, str],
                payload: str) -> dict[str, str]:
        c = self.credentials.get()
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        headers = {**{k.lower(): v for k, v in headers.items()}, "host": self.host, "x-amz-date": now,
                   "x-amz-content-sha256": payload}
        if c.token:
            headers["x-amz-security-token"] = c.token
        names = sorted(headers)
        canonical = "\n".join([method, path, "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query)),
                               "".join(f"{k}:{' '.join(headers[k].split())}\n" for k in names), ";".join(names),
                               payload])
        scope = f"{now[:8]}/{self.region}/s3/aws4_request"
        text = f"AWS4-HMAC-SHA256\n{now}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        key = ("AWS4" + c.secret).encode()
        for part in (now[:8], self.region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(key, text.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={c.key}/{scope}, "
                                    f"SignedHeaders={';'.join(names)}, Signature={signature}")
        return headers

    def request(self, method: str, key: str, query: list[tuple[str, str]], *, body: bytes = b"",
                headers: Mapping[str, str] | None = None, unsigned: bool = False) -> Response:
        """One request, retried on a connection error, a timeout, 5xx and 429; S3Error unless 2xx (a 200
        whose body is an <Error>, as CompleteMultipartUpload may answer, is a 500)."""
        path = self.base + "/" + _quote(key, safe="-_.~/") if key else (self.base or "/")
        target = path + ("?" + "&".join(f"{_quote(k)}={_quote(v)}" if v else _quote(k) for k, v in query) if query else "")
        payload = "UNSIGNED-PAYLOAD" if unsigned else hashlib.sha256(body).hexdigest()
        failure: S3Error | None = None
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(min(5.0, 0.2 * 2 ** attempt) * random.uniform(0.5, 1.0))
            signed = self._signed(method, path, [(k, v) for k, v in query], dict(headers or {}), payload)
            conn = self._connection()
            try:
                conn.request(method, target, body=body, headers=signed)
                r = conn.getresponse()
                data = r.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._local.conn = None
                failure = S3Error(0, type(exc).__name__, str(exc) or "connection lost", retries=attempt)
                continue
            status = 500 if r.status == 200 and data.lstrip().startswith(b"<Error") else r.status
            if 200 <= status < 300:
                return Response(status, {k.lower(): v for k, v in r.getheaders()}, data, attempt)
            fields = _xml(data) if data.lstrip().startswith(b"<") else {}
            failure = S3Error(status, fields.get("Code", r.reason), fields.get("Message", data[:200].decode("utf-8", "replace")),
                              retries=attempt)
            if status not in RETRYABLE:
                raise failure
        assert failure is not None
        raise failure

    # -- the multipart upload ---------------------------------------------------

    def create(self, key: str) -> str:
        """CreateMultipartUpload: the upload's ID."""
        return _xml(self.request("POST", key, [("uploads", "")]).body)["UploadId"]

    def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> str:
        """UploadPart: the part's ETag. The store checks the Content-MD5."""
        md5 = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
        r = self.request("PUT", key, [("partNumber", str(number)), ("uploadId", upload_id)], body=data,
                         headers={"Content-MD5": md5}, unsigned=True)
        return r.headers["etag"]

    def complete(self, key: str, upload_id: str, etags: list[str], *, create_only: bool = True) -> Response:
        """CompleteMultipartUpload, with If-None-Match: * when CREATE_ONLY (412 when the object exists;
        without it only for bench/checkpoint-s3's plain upload)."""
        body = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>" for n, e in enumerate(etags, 1))
        xml = f'<CompleteMultipartUpload xmlns="http://s3.amazonaws.com/doc/2006-03-01/">{body}</CompleteMultipartUpload>'
        headers = {"Content-Type": "application/xml", **({"If-None-Match": "*"} if create_only else {})}
        return self.request("POST", key, [("uploadId", upload_id)], body=xml.encode(), headers=headers)

    def abort(self, key: str, upload_id: str) -> None:
        """AbortMultipartUpload: its parts are gone (404: it was already)."""
        try:
            self.request("DELETE", key, [("uploadId", upload_id)])
        except S3Error as exc:
            if exc.status != 404:
                raise

    def uploads(self, prefix: str) -> list[tuple[str, str]]:
        """ListMultipartUploads under PREFIX: (key, upload ID) of every upload not completed nor aborted
        (the first 1000)."""
        import xml.etree.ElementTree as ET

        root = ET.fromstring(self.request("GET", "", [("prefix", prefix), ("uploads", "")]).body)
        out = []
        for el in root.iter():
            if _NS.sub("", el.tag) == "Upload":
                fields = {_NS.sub("", c.tag): c.text or "" for c in el}
                out.append((fields["Key"], fields["UploadId"]))
        return out
