"""A release copied into a registry the cluster can reach (docs/install.md, "Into a private
registry"): an air-gapped cluster, or one that pulls only from its own registry.

A release directory holds, beside its manifests, `dispatch-k8s-images-VERSION.tar`: an OCI image
layout (`oci-layout`, `index.json`, `blobs/sha256/...`) with each release image's index under the
name `dispatch/NAME:TAG`, listed in SHA256SUMS like every other file. `mirror(...)`:

1. reads release.json (each image `REGISTRY/dispatch/NAME:TAG@sha256:DIGEST`) and checks the
   archive against SHA256SUMS, then each image's digest against the layout's index.json;
2. copies each image index with all its images to `TO/dispatch/NAME:TAG`, and the chart (Helm's
   OCI artifact) to `TO/dispatch/charts/dispatch-k8s:VERSION`, byte for byte (`skopeo copy --all
   --preserve-digests`), so the digest the registry stores is the release's, and checks the digest
   skopeo reports;
3. writes into OUT the manifests with each reference moved to TO (the same repository, tag and
   digest), release.json naming TO, the chart as it was (`--set images.registry=TO`: its images
   keep their digests), and SHA256SUMS.

Nothing is written into the release directory, and OUT only after every image is copied. Exit
codes of the command: 2 for input that cannot be used (named in one line), 1 when skopeo or the
registry refuses (skopeo's last line).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping

# host[:port] with an optional path, lower case as OCI repository names are.
REGISTRY = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)*")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MANIFESTS = ("controller.yaml", "dispatcher.yaml", "sidecar-rbac.yaml")
REF_NAME = "org.opencontainers.image.ref.name"
CHART = "charts/dispatch-k8s"  # the chart's name among the images: its repository is dispatch/charts/dispatch-k8s
CHUNK = 1 << 20


class MirrorError(ValueError):
    """The release or the destination cannot be used as given; the message names which and why."""


class CopyError(RuntimeError):
    """skopeo or the registry refused a copy; the message is what they said."""


def archive_name(version: str) -> str:
    return f"dispatch-k8s-images-{version}.tar"


def repository(name: str) -> str:
    return f"dispatch/{name}"


def check_registry(registry: str) -> str:
    if not REGISTRY.fullmatch(registry):
        raise MirrorError(f"registry {registry!r}: must be a host[:port][/path] in lower case ({REGISTRY.pattern})")
    return registry


@dataclasses.dataclass(frozen=True)
class Image:
    """An image index of the release, or its chart (Helm's OCI artifact, named `charts/dispatch-k8s`)."""
    name: str
    tag: str
    digest: str

    def reference(self, registry: str) -> str:
        return f"{registry}/{repository(self.name)}:{self.tag}@{self.digest}"

    @property
    def ref_name(self) -> str:
        """Its name in the layout (index.json's ref.name annotation)."""
        return f"{repository(self.name)}:{self.tag}"


@dataclasses.dataclass(frozen=True)
class Release:
    directory: pathlib.Path
    meta: dict[str, object]
    registry: str
    version: str
    images: tuple[Image, ...]
    chart: Image | None  # in release.json when the chart was pushed with the images

    @property
    def artifacts(self) -> tuple[Image, ...]:
        """What the archive carries and a mirror copies: the images and the chart."""
        return self.images + ((self.chart,) if self.chart else ())


def read_release(directory: pathlib.Path) -> Release:
    """The release in DIRECTORY, its release.json checked field by field."""
    try:
        meta = json.loads((directory / "release.json").read_text())
    except FileNotFoundError:
        raise MirrorError(f"{directory}: no release.json (a directory `make release` wrote)") from None
    except (OSError, ValueError) as exc:
        raise MirrorError(f"{directory / 'release.json'}: not readable JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise MirrorError(f"{directory / 'release.json'}: must be an object")
    registry, version, tag, refs = meta.get("registry"), meta.get("version"), meta.get("tag"), meta.get("images")
    if not isinstance(registry, str) or not REGISTRY.fullmatch(registry):
        raise MirrorError(f"release.json registry: must be a host[:port][/path], found {registry!r}")
    if not isinstance(version, str) or not version or "/" in version:
        raise MirrorError(f"release.json version: must be a version, found {version!r}")
    if not isinstance(tag, str) or not tag:
        raise MirrorError(f"release.json tag: must be the images' tag, found {tag!r}")
    if not isinstance(refs, dict) or not refs:
        raise MirrorError("release.json images: must map each image's name to its reference")
    found = []
    for name, ref in sorted(refs.items()):
        prefix = f"{registry}/{repository(name)}:{tag}@"
        if not (isinstance(ref, str) and ref.startswith(prefix) and DIGEST.fullmatch(ref[len(prefix):])):
            raise MirrorError(f"release.json images.{name}: must be {prefix}sha256:<64 hex>, found {ref!r}")
        found.append(Image(name=name, tag=tag, digest=ref[len(prefix):]))
    return Release(directory=directory, meta=meta, registry=registry, version=version, images=tuple(found),
                   chart=_chart(meta.get("chart"), registry=registry, version=version))


def _chart(ref: object, *, registry: str, version: str) -> Image | None:
    """release.json's `chart`: REGISTRY/dispatch/charts/dispatch-k8s:TAG@sha256:..., TAG the version as
    Helm tags it (`+` written `_`); absent in a release made without its images archive."""
    if ref is None:
        return None
    chart = Image(name=CHART, tag=version.replace("+", "_"), digest="")
    prefix = f"{registry}/{chart.ref_name}@"
    if not (isinstance(ref, str) and ref.startswith(prefix) and DIGEST.fullmatch(ref[len(prefix):])):
        raise MirrorError(f"release.json chart: must be {prefix}sha256:<64 hex>, found {ref!r}")
    return dataclasses.replace(chart, digest=ref[len(prefix):])


def sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_sum(directory: pathlib.Path, filename: str) -> pathlib.Path:
    """DIRECTORY/FILENAME, once its sha256 is the one SHA256SUMS lists for it."""
    try:
        sums = (directory / "SHA256SUMS").read_text()
    except FileNotFoundError:
        raise MirrorError(f"{directory}: no SHA256SUMS") from None
    listed = {line[66:]: line[:64] for line in sums.splitlines() if len(line) > 66 and line[64:66] == "  "}
    if filename not in listed:
        raise MirrorError(f"SHA256SUMS: lists no {filename} (a release made without its images archive?)")
    path = directory / filename
    if not path.is_file():
        raise MirrorError(f"{path}: not found")
    if sha256_file(path) != listed[filename]:
        raise MirrorError(f"{path}: its sha256 is not the one SHA256SUMS lists (a damaged or partial copy)")
    return path


def unpack(archive: pathlib.Path, into: pathlib.Path) -> dict[str, str]:
    """Extract the layout (regular files and directories only, nothing outside INTO) and answer its
    index.json's images: ref.name -> digest."""
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")
        index = json.loads((into / "index.json").read_text())
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise MirrorError(f"{archive}: not an OCI image layout archive: {exc}") from None
    found = {}
    for entry in index.get("manifests") or []:
        ref_name = (entry.get("annotations") or {}).get(REF_NAME)
        if ref_name:
            found[ref_name] = entry.get("digest")
    return found


def skopeo_copy(source: str, target: str, *, authfile: str | None = None, cert_dir: str | None = None,
                tls_verify: bool = True, skopeo: str = "skopeo", label: str | None = None) -> str:
    """Copy the image or index SOURCE (a skopeo transport reference, `oci:LAYOUT:REF`) with all its
    images to TARGET (`docker://REGISTRY/REPOSITORY:TAG`, or `dir:PATH`) as it is; answer the digest
    TARGET got, which --preserve-digests makes SOURCE's. LABEL names SOURCE in an error."""
    with tempfile.TemporaryDirectory() as tmp:
        digestfile = pathlib.Path(tmp) / "digest"
        argv = [skopeo, "copy", "--all", "--preserve-digests", "--quiet", "--digestfile", str(digestfile),
                *(["--dest-authfile", authfile] if authfile else []),
                *(["--dest-cert-dir", cert_dir] if cert_dir else []),
                *(["--dest-tls-verify=false"] if not tls_verify and target.startswith("docker://") else []),
                source, target]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
        except FileNotFoundError:
            raise MirrorError(f"skopeo: {skopeo!r} not found (install skopeo: it copies the images)") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise CopyError(f"copying {label or source} to {target}: {last}")
        return digestfile.read_text().strip()


def retarget(text: str, moves: Mapping[str, str]) -> str:
    """TEXT with each reference of MOVES (old -> new) replaced; references are exact, digest and all."""
    for old, new in moves.items():
        text = text.replace(old, new)
    return text


def mirror(directory: pathlib.Path, *, to: str, out: pathlib.Path, authfile: str | None = None,
           cert_dir: str | None = None, tls_verify: bool = True, skopeo: str = "skopeo") -> dict[str, str]:
    """Copy the release in DIRECTORY to the registry TO and write its manifests for TO into OUT (see
    the module docstring). Answers each image's new reference."""
    check_registry(to)
    release = read_release(directory)
    if out.resolve() == directory.resolve():
        raise MirrorError(f"--out {out}: the release's own directory; the mirrored manifests go elsewhere")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MirrorError(f"--out {out}: exists and is not an empty directory")
    if shutil.which(skopeo) is None:
        raise MirrorError(f"skopeo: {skopeo!r} not found (install skopeo: it copies the images)")
    archive = check_sum(directory, archive_name(release.version))
    moves = {}
    with tempfile.TemporaryDirectory() as tmp:
        layout = pathlib.Path(tmp)
        listed = unpack(archive, layout)
        for image in release.artifacts:
            if listed.get(image.ref_name) != image.digest:
                raise MirrorError(f"{archive.name}: {image.ref_name} is {listed.get(image.ref_name)!r} in the "
                                  f"archive, but release.json pins {image.digest}")
        for image in release.artifacts:
            got = skopeo_copy(f"oci:{layout}:{image.ref_name}", f"docker://{to}/{image.ref_name}", authfile=authfile,
                              cert_dir=cert_dir, tls_verify=tls_verify, skopeo=skopeo, label=image.ref_name)
            if got != image.digest:
                raise CopyError(f"{to}/{image.ref_name}: the registry got {got}, not the release's {image.digest}")
            moves[image.reference(release.registry)] = image.reference(to)
    write(release, out=out, to=to, moves=moves)
    return {image.name: image.reference(to) for image in release.artifacts}


def write(release: Release, *, out: pathlib.Path, to: str, moves: Mapping[str, str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for filename in MANIFESTS:
        source = release.directory / filename
        if source.is_file():
            (out / filename).write_text(retarget(source.read_text(), moves))
            written.append(filename)
    for chart in sorted(release.directory.glob("dispatch-k8s-*.tgz")):
        shutil.copyfile(chart, out / chart.name)
        written.append(chart.name)
    meta = {**release.meta, "registry": to, "images": {i.name: i.reference(to) for i in release.images}}
    if release.chart is not None:
        meta["chart"] = release.chart.reference(to)
    (out / "release.json").write_text(json.dumps(meta, indent=2) + "\n")
    written.append("release.json")
    (out / "SHA256SUMS").write_text("".join(f"{sha256_file(out / n)}  {n}\n" for n in sorted(written)))
