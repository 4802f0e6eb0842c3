"""Where the fence's own S3 requests (the multipart upload, dispatch_fence.aws)
find their credentials, as obstore finds its own (docs/checkpoint.md,
Credentials): the keys in the environment; IRSA's role and web-identity token
exchanged with STS; EKS Pod Identity's (or ECS's) container endpoint; the
instance metadata service, unless disabled. The endpoints are small servers of
the test's own on 127.0.0.1; nothing leaves the machine.

- each source gives the credentials it holds, asked the way AWS asks
- credentials about to expire are fetched again; others are kept
- no source is one error naming what was looked for
"""

from __future__ import annotations

import http.server
import json
import pathlib
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator

import pytest

from dispatch_fence import aws

Handler = Callable[[str, str, dict[str, str], bytes], tuple[int, bytes]]


class Endpoint:
    """An HTTP server on 127.0.0.1 answering with HANDLER(method, path, headers, body); `seen` the
    requests."""

    def __init__(self, handler: Handler) -> None:
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = (self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                outer.seen.append(request)
                status, data = handler(*request)
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = _any

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def endpoint() -> Iterator[Callable[[Handler], Endpoint]]:
    made: list[Endpoint] = []

    def make(handler: Handler) -> Endpoint:
        made.append(Endpoint(handler))
        return made[-1]

    yield make
    for e in made:
        e.close()


def iso(seconds_from_now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds_from_now))


def test_the_keys_in_the_environment() -> None:
    chain = aws.Chain({"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_SESSION_TOKEN": "T"}, "eu-west-1")
    assert chain.get() == aws.Credentials("AK", "SK", "T")


def test_irsa_exchanges_the_web_identity_token_with_sts(endpoint: Callable[[Handler], Endpoint],
                                                       tmp_path: pathlib.Path) -> None:
    answer = (f'<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
              f"<AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>AK</AccessKeyId>"
              f"<SecretAccessKey>SK</SecretAccessKey><SessionToken>T</SessionToken>"
              f"<Expiration>{iso(3600)}</Expiration></Credentials></AssumeRoleWithWebIdentityResult>"
              f"</AssumeRoleWithWebIdentityResponse>").encode()
    sts = endpoint(lambda *_: (200, answer))
    token = tmp_path / "token"
    token.write_text("projected-token\n")
    chain = aws.Chain({"AWS_ROLE_ARN": "arn:aws:iam::1:role/train", "AWS_WEB_IDENTITY_TOKEN_FILE": str(token),
                       "AWS_ENDPOINT_URL_STS": sts.url}, "eu-west-1")
    got = chain.get()
    assert (got.key, got.secret, got.token) == ("AK", "SK", "T") and got.expires is not None
    assert chain.get() is got  # kept while it is valid
    [(method, _, headers, body)] = sts.seen
    form = dict(urllib.parse.parse_qsl(body.decode()))
    assert method == "POST" and headers["content-type"] == "application/x-www-form-urlencoded"
    assert form == {"Action": "AssumeRoleWithWebIdentity", "Version": "2011-06-15", "RoleArn": "arn:aws:iam::1:role/train",
                    "WebIdentityToken": "projected-token", "RoleSessionName": "dispatch-fence"}


def test_pod_identity_asks_the_container_endpoint_and_again_before_expiry(endpoint: Callable[[Handler], Endpoint],
                                                                         tmp_path: pathlib.Path) -> None:
    served = iter([iso(60), iso(3600)])  # the first expires within the five minutes kept in hand
    agent = endpoint(lambda *_: (200, json.dumps({"AccessKeyId": "AK", "SecretAccessKey": "SK", "Token": "T",
                                                  "Expiration": next(served)}).encode()))
    token = tmp_path / "token"
    token.write_text("pod-token")
    chain = aws.Chain({"AWS_CONTAINER_CREDENTIALS_FULL_URI": agent.url + "/v1/credentials",
                       "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token)}, "eu-west-1")
    first = chain.get()
    second = chain.get()
    assert second is not first and chain.get() is second
    assert [(m, p, h["authorization"]) for m, p, h, _ in agent.seen] == [("GET", "/v1/credentials", "pod-token")] * 2


def test_the_instance_metadata_service_with_a_session_token(endpoint: Callable[[Handler], Endpoint]) -> None:
    def imds(method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        if (method, path) == ("PUT", "/latest/api/token"):
            return 200, b"session"
        if headers.get("x-aws-ec2-metadata-token") != "session":
            return 401, b""
        if path == "/latest/meta-data/iam/security-credentials/":
            return 200, b"node-role"
        return 200, json.dumps({"AccessKeyId": "AK", "SecretAccessKey": "SK", "Token": "T",
                                "Expiration": iso(3600)}).encode()

    md = endpoint(imds)
    got = aws.Chain({"AWS_EC2_METADATA_SERVICE_ENDPOINT": md.url}, "eu-west-1").get()
    assert (got.key, got.secret, got.token) == ("AK", "SK", "T")
    assert [(m, p) for m, p, _, _ in md.seen] == [("PUT", "/latest/api/token"),
                                                  ("GET", "/latest/meta-data/iam/security-credentials/"),
                                                  ("GET", "/latest/meta-data/iam/security-credentials/node-role")]


def test_no_credentials_is_one_error_naming_what_was_looked_for() -> None:
    with pytest.raises(aws.S3Error) as found:
        aws.Chain({"AWS_EC2_METADATA_DISABLED": "true"}, "eu-west-1").get()
    assert str(found.value) == ("no response NoCredentials: no credentials in the environment (AWS_ACCESS_KEY_ID, "
                                "IRSA, Pod Identity) and the instance metadata service is disabled")
