"""A GCS root for dispatch_fence.objectstore, over google-cloud-storage (Google's
client of the JSON API, whose writes take ifGenerationMatch): the interface of
dispatch_fence.client, and nothing of the fence above it (the protocol imports
this module, only for a gs:// root, never the other way).

Configured the way training pods get it: Application Default Credentials
(GKE Workload Identity through the node's metadata server, or
GOOGLE_APPLICATION_CREDENTIALS naming a service-account key or an
external_account file for workload identity federation with a web-identity
token). STORAGE_EMULATOR_HOST points it at an emulator, anonymously
(docs/checkpoint.md, Credentials).

Create-only is an upload with ifGenerationMatch=0, compare-and-set an upload with
ifGenerationMatch=<generation>; both answered 412 when the condition fails. A
file above the threshold (dispatch_fence.transfer) goes up as a resumable
upload in chunks of the part size, the precondition applied when it is
finalized (the client sends a file of at most 8 MiB in one request whatever the
threshold). A resumable session cannot be split, so the streams of a GCS root
run across files. A failed session leaves no object and expires.

The client retries a create that timed out (the precondition makes it safe); a
412 (or a finalized session's 404) on a create it retried is judged against
what it meant to write (transfer.Attempts): the same size and MD5, it landed.
"""

from __future__ import annotations

import base64

from google.api_core import exceptions
from google.api_core import retry as api_retry
from google.auth import exceptions as auth_exceptions
from google.cloud import storage
from google.cloud.storage import exceptions as storage_exceptions

from dispatch_fence import client, model, transfer

# requests' errors are OSErrors; InvalidResponse and DataCorruption are the media layer's.
ERRORS = (exceptions.GoogleAPIError, auth_exceptions.GoogleAuthError, storage_exceptions.InvalidResponse,
          storage_exceptions.DataCorruption, OSError, ValueError)


class Store:
    """One bucket and prefix; keys relative to the prefix."""

    stale_version = "1"

    def __init__(self, *, bucket: str, prefix: str, url: str) -> None:
        self.url = url
        self._base = f"{prefix}/" if prefix else ""
        self.settings = transfer.settings()
        try:
            self._client = storage.Client()
        except ERRORS as exc:
            raise client.failure(url, what="configure", key=bucket, exc=exc) from None
        self._bucket = self._client.bucket(bucket)
        self.pool = transfer.Pool(self.settings)

    def _blob(self, key: str) -> storage.Blob:
        return self._bucket.blob(self._base + key)

    def list_root(self) -> client.Listing:
        try:
            pages = self._client.list_blobs(self._bucket, prefix=self._base, delimiter="/")
            blobs = list(pages)
            prefixes = sorted(pages.prefixes)
        except ERRORS as exc:
            raise client.failure(self.url, what="list", key=self._base or "/", exc=exc) from None
        names = [p[len(self._base):].rstrip("/") for p in prefixes]
        latest = next((str(b.generation) for b in blobs if b.name == self._base + model.LATEST), None)
        return client.Listing(names=names, latest=latest)

    def list_keys(self, prefix: str) -> list[str]:
        try:
            under = f"{self._base}{prefix}/" if prefix else self._base
            return [b.name[len(self._base):] for b in self._client.list_blobs(self._bucket, prefix=under)]
        except ERRORS as exc:
            raise client.failure(self.url, what="list", key=prefix, exc=exc) from None

    def read(self, key: str) -> bytes | None:
        try:
            return bytes(self._blob(key).download_as_bytes())
        except exceptions.NotFound:
            return None
        except ERRORS as exc:
            raise client.failure(self.url, what="read", key=key, exc=exc) from None

    def read_range(self, key: str, start: int, length: int) -> bytes | None:
        try:  # the JSON API's alt=media with a Range header; END is inclusive
            return bytes(self._blob(key).download_as_bytes(start=start, end=start + length - 1))
        except exceptions.NotFound:
            return None
        except ERRORS as exc:
            raise client.failure(self.url, what=f"read bytes {start}+{length} of", key=key, exc=exc) from None

    def exists(self, key: str) -> bool:
        try:
            return bool(self._blob(key).exists())
        except ERRORS as exc:
            raise client.failure(self.url, what="head", key=key, exc=exc) from None

    def create(self, key: str, source: str | bytes, *, gate: transfer.Gate | None = None) -> None:
        """Create-only; client.Exists when the object is there (and not this write's own, retried). With
        GATE it waits before it starts (a resumable session cannot hold its last chunk back)."""
        if gate is not None:
            gate.wait()
        attempts = transfer.Attempts()
        retry = api_retry.Retry(predicate=storage.retry.DEFAULT_RETRY._predicate, on_error=attempts.again)
        try:
            size = transfer.size_of(source)
            blob = self._blob(key)
            if size > self.settings.threshold:
                blob.chunk_size = self.settings.part_size  # a resumable upload, chunk by chunk
            with self.pool.body():
                if isinstance(source, bytes):
                    blob.upload_from_string(source, if_generation_match=0, retry=retry)
                else:
                    blob.upload_from_filename(source, if_generation_match=0, retry=retry)
        except (exceptions.PreconditionFailed, exceptions.NotFound) as exc:
            if attempts.retried and self._landed(key, source):
                return
            if isinstance(exc, exceptions.PreconditionFailed):
                raise client.Exists(key) from None
            raise client.failure(self.url, what="create", key=key, exc=exc) from None
        except ERRORS as exc:
            raise client.failure(self.url, what="create", key=key, exc=exc) from None

    def _landed(self, key: str, source: str | bytes) -> bool:
        """Whether the object at KEY is what SOURCE holds: the size, then the MD5 the store keeps."""
        try:
            found = self._bucket.get_blob(self._base + key)
        except ERRORS:
            return False
        if found is None or found.size != transfer.size_of(source):
            return False
        md5 = base64.b64encode(transfer.digest(transfer.chunks(source), "md5")).decode()
        return bool(found.md5_hash == md5)

    def replace(self, key: str, data: bytes, *, version: str | None) -> None:
        try:
            self._blob(key).upload_from_string(data, if_generation_match=int(version) if version else 0)
        except exceptions.PreconditionFailed:
            raise client.Conflict(key) from None
        except ERRORS as exc:
            raise client.failure(self.url, what="replace", key=key, exc=exc) from None

    def delete(self, key: str) -> None:
        try:
            self._blob(key).delete()
        except exceptions.NotFound:
            pass
        except ERRORS as exc:
            raise client.failure(self.url, what="delete", key=key, exc=exc) from None

    def close(self) -> None:
        self.pool.close()
