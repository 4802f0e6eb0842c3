"""The local cluster's container registry: images reach the node as they reach a real one.

distribution's `registry` (build-controllers.sh, set `services`) runs beside the node; a pod names
an image `NAME/REPOSITORY:TAG@sha256:...`, and the node's containerd resolves NAME to this registry
through its own registry configuration (a `hosts.toml` under the node's config dir, never /etc's)
and pulls it, as the kubelet asks (`imagePullPolicy: IfNotPresent`).

Invariants:
- No anonymous access: every request, pull and push alike, needs the one user's password
  (htpasswd, bcrypt); the password is random per registry and lives only in its state directory,
  the podman auth file and containerd's `hosts.toml`, all root-only (directories 0700, files 0600).
  So no other local user can push an image, let alone replace one the kubelet runs.
- TLS only, with a certificate from the control plane's CA for NAME and 127.0.0.1; it listens on
  127.0.0.1 only, so nothing off the host reaches it. containerd trusts that CA for this host alone.
- NAME is under `.test` (RFC 2606: reserved, never delegated), so no reference to it can ever mean
  a registry elsewhere; containerd's configuration maps it to the endpoint with no fallback to the
  name itself, so no pull of it leaves the host (not even a DNS query).
- Its state (storage, htpasswd, password, auth file) is in the cluster's state directory: a new
  cluster starts with an empty registry. Its process group is recorded with the node's (the node
  starts and stops it: `node.Node`), so `toolkit cluster down` and the node's sweep end it too.
"""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import json
import os
import pathlib
import re
import secrets
import ssl
import time
import urllib.error
import urllib.request

import yaml

from devcluster import harness, node
from release import contexts

DEFAULT_NAME = "registry.dispatch.test"
USER = "dispatch"
READY_TIMEOUT_SECONDS = 60.0
PUSH_TIMEOUT_SECONDS = 600.0
# A DNS name of lowercase labels ending in .test: what an image reference takes as its registry part.
_NAME = re.compile(r"^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+test$")
_REPOSITORY = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class RegistryError(harness.HarnessError):
    """A one-line reason the registry cannot start, or a push that failed."""


def check_name(name: str) -> str:
    """NAME if it is a registry name this cluster may take: a DNS name under the reserved .test."""
    if len(name) > 253 or not _NAME.match(name):
        raise RegistryError(f"registry name {name!r} must be a lowercase DNS name under .test "
                            "(e.g. registry.dispatch.test), at most 253 characters")
    return name


def bcrypt_hash(password: str) -> str:
    """The bcrypt hash of PASSWORD (cost 10), by the C library's crypt (libxcrypt), for htpasswd."""
    path = ctypes.util.find_library("crypt")
    if path is None:
        raise RegistryError("libcrypt is not installed (Debian: libcrypt1)")
    lib = ctypes.CDLL(path)
    lib.crypt_gensalt.restype = ctypes.c_char_p
    lib.crypt_gensalt.argtypes = (ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int)
    lib.crypt.restype = ctypes.c_char_p
    lib.crypt.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
    salt = lib.crypt_gensalt(b"$2b$", 10, None, 0)  # no random bytes given: the library reads the OS's
    hashed = lib.crypt(password.encode(), salt) if salt else None
    if not hashed or not hashed.startswith(b"$2b$"):
        raise RegistryError("libcrypt made no bcrypt hash (is it libxcrypt?)")
    return hashed.decode()


def _private_file(path: pathlib.Path, text: str) -> None:
    """Write TEXT to PATH readable by its owner only, from the first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def _private_dir(path: pathlib.Path) -> pathlib.Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


class Registry:
    """The registry of one cluster. `name` is what image references say, `endpoint` where it
    listens (`127.0.0.1:PORT`); `username` and `password` its one user's credentials; `authfile`
    and `cert_dir` are podman's `--authfile` and `--cert-dir` for it; `push()` puts a podman
    image there and returns its digest."""

    def __init__(self, plane: harness.ControlPlane, *, bin_dir: pathlib.Path, name: str = DEFAULT_NAME) -> None:
        self.plane = plane
        self.name = check_name(name)
        self.binary = bin_dir / "registry"
        self.dir = pathlib.Path(plane.workdir) / "registry"
        self.ca_file = plane.ca_file
        self.endpoint = f"127.0.0.1:{harness.free_port()}"
        self.username = USER
        self.password = secrets.token_urlsafe(32)
        self.authfile = self.dir / "auth.json"
        self.cert_dir = self.dir / "client-certs"
        self.process: harness._Process | None = None

    @classmethod
    def open(cls, workdir: pathlib.Path) -> Registry:
        """The running registry of the cluster whose state directory is WORKDIR (`toolkit cluster up`
        writes `<state>/registry/registry.json`), to push to and name images by; not to stop."""
        try:
            saved = json.loads((workdir / "registry" / "registry.json").read_text())
        except FileNotFoundError:
            raise RegistryError(f"no registry in {workdir} (is the cluster up? `toolkit cluster up`)") from None
        registry = cls.__new__(cls)
        registry.name, registry.endpoint, registry.password = saved["name"], saved["endpoint"], saved["password"]
        registry.username = USER
        registry.dir = workdir / "registry"
        registry.ca_file = saved["ca_file"]
        registry.authfile = registry.dir / "auth.json"
        registry.cert_dir = registry.dir / "client-certs"
        registry.process = None
        return registry

    # -- lifecycle -------------------------------------------------------

    def start(self) -> Registry:
        """Write the state directory and configuration, start the registry, wait until it serves an
        authenticated request. The caller records `process` for the sweep (`node.Node` does)."""
        if not os.access(self.binary, os.X_OK):
            raise RegistryError(f"registry not found in {self.binary.parent}: run `make controllers`")
        _private_dir(self.dir)
        _private_dir(self.dir / "data")
        _private_file(self.dir / "htpasswd", f"{USER}:{bcrypt_hash(self.password)}\n")
        cert, key = self.plane.issue("registry", subject=f"/CN={self.name}", server=True,
                                     sans=(f"DNS:{self.name}",))
        config = {
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.dir / "data")},
                        "delete": {"enabled": False}},
            "http": {"addr": self.endpoint, "secret": secrets.token_hex(32),
                     "tls": {"certificate": cert, "key": key, "minimumtls": "tls1.2"},
                     "headers": {"X-Content-Type-Options": ["nosniff"]}},
            "auth": {"htpasswd": {"realm": self.name, "path": str(self.dir / "htpasswd")}},
        }
        _private_file(self.dir / "config.yml", yaml.safe_dump(config))
        _private_file(self.authfile, json.dumps({"auths": {
            host: {"auth": base64.b64encode(f"{USER}:{self.password}".encode()).decode()}
            for host in (self.endpoint, self.name)}}, indent=1))
        _private_dir(self.cert_dir)
        _private_file(self.cert_dir / "ca.crt", pathlib.Path(self.ca_file).read_text())
        _private_file(self.dir / "registry.json", json.dumps({
            "name": self.name, "endpoint": self.endpoint, "password": self.password, "ca_file": self.ca_file}))
        # No trace export (its default is an OTLP collector on localhost): nothing is collecting.
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "OTEL_TRACES_EXPORTER": "none"}
        self.process = node.node_process("registry", [str(self.binary), "serve", str(self.dir / "config.yml")],
                                         pathlib.Path(self.plane.log_dir), env=env, lock_fd=-1)
        self.process.start()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def check_alive(self) -> None:
        if self.process is not None:
            self.process.check_alive()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        last = ""
        while time.monotonic() < deadline:
            assert self.process is not None
            self.process.check_alive()
            try:
                if self.request("/v2/", authenticated=True) == 200:
                    return
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.1)
        raise RegistryError(f"the registry did not answer at https://{self.endpoint}/v2/ after "
                            f"{READY_TIMEOUT_SECONDS}s: {last}")

    # -- clients ---------------------------------------------------------

    def authorization(self) -> str:
        """The value of the Authorization header every request needs."""
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()

    def request(self, path: str, *, authenticated: bool, method: str = "GET") -> int:
        """The HTTP status of one request to the registry's API (TLS checked against the cluster's CA)."""
        headers = {"Authorization": self.authorization()} if authenticated else {}
        req = urllib.request.Request(f"https://{self.endpoint}{path}", method=method, headers=headers)
        context = ssl.create_default_context(cafile=self.ca_file)
        try:
            with urllib.request.urlopen(req, timeout=5, context=context) as response:
                return int(response.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    def containerd_hosts(self, config_path: pathlib.Path) -> pathlib.Path:
        """Write NAME's `hosts.toml` under CONFIG_PATH (containerd's registry `config_path`): the
        endpoint as the only host, its CA, and the credentials as a header sent with every request.
        Returns the file."""
        directory = _private_dir(_private_dir(config_path) / self.name)
        hosts = directory / "hosts.toml"
        _private_file(hosts, (
            f"# {self.name} is this cluster's registry; no other host serves it.\n"
            f"server = 'https://{self.endpoint}'\n"
            f"ca = '{self.ca_file}'\n"
            "capabilities = ['pull', 'resolve']\n"
            "\n[header]\n"
            f"  Authorization = '{self.authorization()}'\n"))
        return hosts

    def reference(self, repository: str, tag: str, digest: str) -> str:
        """`NAME/REPOSITORY:TAG@DIGEST`, as a pod names the image."""
        return f"{self.name}/{repository}:{tag}@{digest}"

    def push(self, local_image: str, repository: str, tag: str) -> str:
        """Push LOCAL_IMAGE (podman's store) as REPOSITORY:TAG; returns the manifest digest
        (`sha256:...`) that the registry serves it under."""
        if not _REPOSITORY.match(repository):
            raise RegistryError(f"repository {repository!r} is not a valid OCI repository name "
                                "(lowercase path components of [a-z0-9] joined by . _ __ -)")
        if not _TAG.match(tag):
            raise RegistryError(f"tag {tag!r} is not a valid OCI tag ([A-Za-z0-9_][A-Za-z0-9_.-], at most 128)")
        digestfile = self.dir / f"push-{secrets.token_hex(6)}.digest"
        try:
            done = contexts.podman("push", "--quiet", "--authfile", str(self.authfile), "--cert-dir", str(self.cert_dir),
                                    "--digestfile", str(digestfile), local_image,
                                    f"docker://{self.endpoint}/{repository}:{tag}", timeout=PUSH_TIMEOUT_SECONDS)
            if done.returncode != 0:
                raise RegistryError(f"podman push {local_image} to {self.name}/{repository}:{tag} exited "
                                    f"{done.returncode}: {done.stderr.strip()[-400:]}")
            digest = digestfile.read_text().strip()
        finally:
            digestfile.unlink(missing_ok=True)
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise RegistryError(f"podman push of {local_image} wrote no digest (got {digest!r})")
        return digest

