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
large file goes up as a resumable upload, which takes the same precondition.
"""

from __future__ import annotations

from google.api_core import exceptions
from google.cloud import storage

from dispatch_fence import client, model


class Store:
    """One bucket and prefix; keys relative to the prefix."""

    stale_version = "1"

    def __init__(self, *, bucket: str, prefix: str, url: str) -> None:
        self.url = url
        self._base = f"{prefix}/" if prefix else ""
        self._client = storage.Client()
        self._bucket = self._client.bucket(bucket)

    def _blob(self, key: str) -> storage.Blob:
        return self._bucket.blob(self._base + key)

    def list_root(self) -> client.Listing:
        try:
            pages = self._client.list_blobs(self._bucket, prefix=self._base, delimiter="/")
            blobs = list(pages)
            prefixes = sorted(pages.prefixes)
        except exceptions.GoogleAPIError as exc:
            raise client.failure(self.url, what="list", key=self._base or "/", exc=exc) from None
        names = [p[len(self._base):].rstrip("/") for p in prefixes]
        latest = next((str(b.generation) for b in blobs if b.name == self._base + model.LATEST), None)
        return client.Listing(names=names, latest=latest)

    def list_keys(self, prefix: str) -> list[str]:
        try:
            under = f"{self._base}{prefix}/" if prefix else self._base
            return [b.name[len(self._base):] for b in self._client.list_blobs(self._bucket, prefix=under)]
        except exceptions.GoogleAPIError as exc:
            raise client.failure(self.url, what="list", key=prefix, exc=exc) from None

    def read(self, key: str) -> bytes | None:
        try:
            return bytes(self._blob(key).download_as_bytes())
        except exceptions.NotFound:
            return None
        except exceptions.GoogleAPIError as exc:
            raise client.failure(self.url, what="read", key=key, exc=exc) from None

    def exists(self, key: str) -> bool:
        try:
            return bool(self._blob(key).exists())
        except exceptions.GoogleAPIError as exc:
            raise client.failure(self.url, what="head", key=key, exc=exc) from None

    def create(self, key: str, source: str | bytes) -> None:
        blob = self._blob(key)
        try:
            if isinstance(source, bytes):
                blob.upload_from_string(source, if_generation_match=0)
            else:
                blob.upload_from_filename(source, if_generation_match=0)
        except exceptions.PreconditionFailed:
            raise client.Exists(key) from None
        except exceptions.GoogleAPIError as exc:
            raise client.failure(self.url, what="create", key=key, exc=exc) from None

    def replace(self, key: str, data: bytes, *, version: str | None) -> None:
        try:
            self._blob(key).upload_from_string(data, if_generation_match=int(version) if version else 0)
        except exceptions.PreconditionFailed:
            raise client.Conflict(key) from None
        except exceptions.GoogleAPIError as exc:
            raise client.failure(self.url, what="replace", key=key, exc=exc) from None

    def delete(self, key: str) -> None:
        try:
            self._blob(key).delete()
        except exceptions.NotFound:
            pass
        except exceptions.GoogleAPIError as exc:
            raise client.failure(self.url, what="delete", key=key, exc=exc) from None
