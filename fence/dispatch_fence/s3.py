"""An S3 root for dispatch_fence.objectstore: the interface of
dispatch_fence.client, and nothing of the fence above it (the protocol imports
this module, only for an s3:// root, never the other way).

Two clients, one per kind of request: obstore (the Python binding of Apache
Arrow's Rust object_store) lists, reads, deletes and makes every write of one
request; dispatch_fence.aws makes the multipart upload of a file above the
threshold (dispatch_fence.transfer), which obstore cannot make create-only.
Both are configured from the environment the way training pods get it:
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), or IRSA's
AWS_ROLE_ARN with AWS_WEB_IDENTITY_TOKEN_FILE; AWS_REGION; AWS_ENDPOINT_URL and
AWS_ALLOW_HTTP=true for an S3-compatible server (docs/checkpoint.md, Credentials).

Create-only is PutObject with If-None-Match: *, or a multipart upload whose
CompleteMultipartUpload carries it (its parts in parallel on the store's
streams; aborted, parts and all, when it fails); compare-and-set is PutObject
with If-Match: <ETag>. Each is answered 412 when the condition fails. A 412 on
a create the client retried (its first response lost) is judged against what
it meant to write (transfer.Attempts): the same size and content, it landed.
"""

from __future__ import annotations

import pathlib
import re

import obstore
from obstore import exceptions
from obstore.store import S3Store

from dispatch_fence import aws, client, model, transfer

_RETRIES = re.compile(r"after (\d+) retries")
ERRORS = (exceptions.BaseError, OSError, aws.S3Error)


def _retries(exc: Exception) -> int:
    """How often obstore sent the request again (object_store writes it into its error)."""
    found = _RETRIES.search(str(exc))
    return int(found.group(1)) if found else 0


class Store:
    """One bucket and prefix; keys relative to the prefix."""

    stale_version = '"00000000000000000000000000000000"'

    def __init__(self, *, bucket: str, prefix: str, url: str) -> None:
        self.url = url
        self._base = f"{prefix}/" if prefix else ""
        self.settings = transfer.settings()
        try:
            self._s3 = S3Store(bucket)
            self._aws = aws.Client(bucket)
        except ERRORS as exc:
            raise client.failure(url, what="configure", key=bucket, exc=exc) from None
        self.pool = transfer.Pool(self.settings)

    def _key(self, key: str) -> str:
        return self._base + key

    def list_root(self) -> client.Listing:
        try:
            found = obstore.list_with_delimiter(self._s3, self._base.rstrip("/") or None)
        except ERRORS as exc:
            raise client.failure(self.url, what="list", key=self._base or "/", exc=exc) from None
        names = [p[len(self._base):].rstrip("/") for p in found["common_prefixes"]]
        latest = next((o["e_tag"] for o in found["objects"] if o["path"] == self._key(model.LATEST)), None)
        return client.Listing(names=names, latest=latest)

    def list_keys(self, prefix: str) -> list[str]:
        try:
            under = self._key(prefix) if prefix else (self._base.rstrip("/") or None)
            return [o["path"][len(self._base):] for batch in obstore.list(self._s3, under) for o in batch]
        except ERRORS as exc:
            raise client.failure(self.url, what="list", key=prefix, exc=exc) from None

    def read(self, key: str) -> bytes | None:
        try:
            return bytes(obstore.get(self._s3, self._key(key)).bytes())
        except (exceptions.NotFoundError, FileNotFoundError):
            return None
        except ERRORS as exc:
            raise client.failure(self.url, what="read", key=key, exc=exc) from None

    def read_range(self, key: str, start: int, length: int) -> bytes | None:
        try:
            return bytes(obstore.get_range(self._s3, self._key(key), start=start, length=length))
        except (exceptions.NotFoundError, FileNotFoundError):
            return None
        except ERRORS as exc:
            raise client.failure(self.url, what=f"read bytes {start}+{length} of", key=key, exc=exc) from None

    def exists(self, key: str) -> bool:
        try:
            obstore.head(self._s3, self._key(key))
            return True
        except (exceptions.NotFoundError, FileNotFoundError):
            return False
        except ERRORS as exc:
            raise client.failure(self.url, what="head", key=key, exc=exc) from None

    def create(self, key: str, source: str | bytes, *, gate: transfer.Gate | None = None) -> None:
        """Create-only; client.Exists when the object is there (and not this write's own, retried). With
        GATE, a multipart upload sends its parts and waits for it to complete; a PutObject waits first."""
        try:
            size = transfer.size_of(source)
            if size <= self.settings.threshold:
                if gate is not None:
                    gate.wait()
                self._put(key, source)
            else:
                self._multipart(key, source, size, gate)
        except (client.Exists, transfer.Cancelled):
            raise
        except ERRORS as exc:
            raise client.failure(self.url, what="create", key=key, exc=exc) from None

    def _put(self, key: str, source: str | bytes) -> None:
        body = pathlib.Path(source) if isinstance(source, str) else source
        try:
            with self.pool.body():
                obstore.put(self._s3, self._key(key), body, mode="create", use_multipart=False)
        except (exceptions.AlreadyExistsError, exceptions.PreconditionError) as exc:
            if _retries(exc) and self._landed(key, source):
                return
            raise client.Exists(key) from None

    def _multipart(self, key: str, path: str | bytes, size: int, gate: transfer.Gate | None) -> None:
        assert isinstance(path, str)  # bytes are the fence's own small objects
        full = self._key(key)
        upload = self._aws.create(full)
        try:
            def part(p: tuple[int, int, int]) -> str:
                if gate is not None and gate.closed:
                    raise transfer.Cancelled("the checkpoint's name was not claimed")
                return self._aws.upload_part(full, upload, p[0], transfer.read_part(path, p[1], p[2]))

            # An upload held by a gate yields the streams to the claim that opens it.
            etags = self.pool.map_parts(part, transfer.parts(size, self.settings.part_size), first=gate is None)
            if gate is not None:
                gate.wait()
            model.hook("multipart")
            self._aws.complete(full, upload, etags)
        except aws.S3Error as exc:
            # A completion the client sent again after a lost response may find its own object
            # (412) or its upload gone (404); the object decides.
            if exc.status in (404, 412) and exc.retries and self._landed(key, path):
                return
            self._abort(full, upload)
            if exc.status == 412:
                raise client.Exists(key) from None
            raise
        except BaseException:
            self._abort(full, upload)
            raise

    def _abort(self, full: str, upload: str) -> None:
        try:
            self._aws.abort(full, upload)
        except aws.S3Error:
            pass  # the bucket's lifecycle rule removes it (docs/checkpoint.md)

    def _landed(self, key: str, source: str | bytes) -> bool:
        """Whether the object at KEY is what SOURCE holds: the size, then the ETag (the MD5, or the
        MD5 of the parts' MD5s when it went up in parts), else the content read back."""
        try:
            meta = obstore.head(self._s3, self._key(key))
        except (exceptions.NotFoundError, FileNotFoundError):
            return False
        if meta["size"] != transfer.size_of(source):
            return False
        etag = (meta["e_tag"] or "").strip('"')
        if "-" in etag:
            if etag == transfer.multipart_etag(source, self.settings.part_size):
                return True
        elif etag == transfer.digest(transfer.chunks(source), "md5").hex():
            return True
        remote = obstore.get(self._s3, self._key(key)).stream()
        return transfer.digest(bytes(b) for b in remote) == transfer.digest(transfer.chunks(source))

    def replace(self, key: str, data: bytes, *, version: str | None) -> None:
        try:
            obstore.put(self._s3, self._key(key), data, mode={"e_tag": version} if version else "create",
                        use_multipart=False)
        except (exceptions.AlreadyExistsError, exceptions.PreconditionError):
            raise client.Conflict(key) from None
        except ERRORS as exc:
            raise client.failure(self.url, what="replace", key=key, exc=exc) from None

    def delete(self, key: str) -> None:
        try:
            obstore.delete(self._s3, self._key(key))
        except (exceptions.NotFoundError, FileNotFoundError):
            pass
        except ERRORS as exc:
            raise client.failure(self.url, what="delete", key=key, exc=exc) from None

    def uploads(self) -> list[tuple[str, str]]:
        """The multipart uploads under the root not completed nor aborted: (key, upload ID)."""
        try:
            return [(k[len(self._base):], u) for k, u in self._aws.uploads(self._base)]
        except ERRORS as exc:
            raise client.failure(self.url, what="list uploads", key=self._base or "/", exc=exc) from None

    def close(self) -> None:
        self.pool.close()

