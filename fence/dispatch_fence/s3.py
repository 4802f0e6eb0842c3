"""An S3 root for dispatch_fence.objectstore, over obstore (the Python binding of
Apache Arrow's Rust object_store, which signs its own requests): the interface
of dispatch_fence.client, and nothing of the fence above it (the protocol
imports this module, only for an s3:// root, never the other way).

Configured from the environment the way training pods get it: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), or IRSA's AWS_ROLE_ARN with
AWS_WEB_IDENTITY_TOKEN_FILE; AWS_REGION; AWS_ENDPOINT_URL and AWS_ALLOW_HTTP=true
for an S3-compatible server (docs/checkpoint.md, Credentials).

Create-only is PutObject with If-None-Match: *, compare-and-set PutObject with
If-Match: <ETag>; both answered 412 when the condition fails. Every data object is
one PutObject (no multipart upload: S3 takes no precondition on it here), so a
file is at most 5 GiB.
"""

from __future__ import annotations

import pathlib

import obstore
from obstore import exceptions
from obstore.store import S3Store

from dispatch_fence import client, model


class Store:
    """One bucket and prefix; keys relative to the prefix."""

    stale_version = '"00000000000000000000000000000000"'

    def __init__(self, *, bucket: str, prefix: str, url: str) -> None:
        self.url = url
        self._base = f"{prefix}/" if prefix else ""
        self._s3 = S3Store(bucket)

    def _key(self, key: str) -> str:
        return self._base + key

    def list_root(self) -> client.Listing:
        try:
            found = obstore.list_with_delimiter(self._s3, self._base.rstrip("/") or None)
        except (exceptions.BaseError, OSError) as exc:
            raise client.failure(self.url, what="list", key=self._base or "/", exc=exc) from None
        names = [p[len(self._base):].rstrip("/") for p in found["common_prefixes"]]
        latest = next((o["e_tag"] for o in found["objects"] if o["path"] == self._key(model.LATEST)), None)
        return client.Listing(names=names, latest=latest)

    def list_keys(self, prefix: str) -> list[str]:
        try:
            under = self._key(prefix) if prefix else (self._base.rstrip("/") or None)
            return [o["path"][len(self._base):] for batch in obstore.list(self._s3, under) for o in batch]
        except (exceptions.BaseError, OSError) as exc:
            raise client.failure(self.url, what="list", key=prefix, exc=exc) from None

    def read(self, key: str) -> bytes | None:
        try:
            return bytes(obstore.get(self._s3, self._key(key)).bytes())
        except (exceptions.NotFoundError, FileNotFoundError):
            return None
        except (exceptions.BaseError, OSError) as exc:
            raise client.failure(self.url, what="read", key=key, exc=exc) from None

    def exists(self, key: str) -> bool:
        try:
            obstore.head(self._s3, self._key(key))
            return True
        except (exceptions.NotFoundError, FileNotFoundError):
            return False
        except (exceptions.BaseError, OSError) as exc:
            raise client.failure(self.url, what="head", key=key, exc=exc) from None

    def create(self, key: str, source: str | bytes) -> None:
        body = pathlib.Path(source) if isinstance(source, str) else source
        try:
            obstore.put(self._s3, self._key(key), body, mode="create", use_multipart=False)
        except (exceptions.AlreadyExistsError, exceptions.PreconditionError):
            raise client.Exists(key) from None
        except (exceptions.BaseError, OSError) as exc:
            raise client.failure(self.url, what="create", key=key, exc=exc) from None

    def replace(self, key: str, data: bytes, *, version: str | None) -> None:
        try:
            obstore.put(self._s3, self._key(key), data, mode={"e_tag": version} if version else "create",
                        use_multipart=False)
        except (exceptions.AlreadyExistsError, exceptions.PreconditionError):
            raise client.Conflict(key) from None
        except (exceptions.BaseError, OSError) as exc:
            raise client.failure(self.url, what="replace", key=key, exc=exc) from None

    def delete(self, key: str) -> None:
        try:
            obstore.delete(self._s3, self._key(key))
        except (exceptions.NotFoundError, FileNotFoundError):
            pass
        except (exceptions.BaseError, OSError) as exc:
            raise client.failure(self.url, what="delete", key=key, exc=exc) from None
