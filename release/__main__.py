"""`python -m release --registry R --kustomize K [--version V] [--out DIR]` (what `make release` runs):
build the images, write them into the bundle's images archive (an OCI layout), copy them from it to
R with skopeo (as logged in: `podman login R`, or --authfile), and write the bundle into DIR
(release.bundle), rendered with `K build` (`make release` passes the kustomize built from its
module, devcluster/build-controllers.sh tools: no Kubernetes build). It also records the
release's image references in toolkit/data/release.json (not committed), so that this checkout's
toolkit, and a wheel built from it, default to the release's sidecar. Root is not needed: with
--bases FILE (release.bases) the bases are loaded into the user's own storage and rootless podman
builds on them. Exit 2 on bad input, one line."""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys

from release import bases, bundle, images, version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make release", description=__doc__)
    parser.add_argument("--registry", required=True, help="host[:port][/path] the images are pushed to and named by")
    parser.add_argument("--version", default=None, help="the release's version (default: derived, release.version)")
    parser.add_argument("--out", default="dist/release", type=pathlib.Path, help="output directory")
    parser.add_argument("--authfile", default=None, help="podman's auth file for the registry")
    parser.add_argument("--no-tls-verify", action="store_true",
                        help="push without TLS verification: plain HTTP, or a certificate not checked "
                             "(a registry on loopback)")
    parser.add_argument("--kustomize", default=None, type=pathlib.Path,
                        help="the kustomize that renders the manifests (required; make release passes "
                             "the one built from its module, devcluster/build-controllers.sh tools)")
    parser.add_argument("--bases", default=None, type=pathlib.Path,
                        help="the images' bases as one archive (`python -m release.bases export FILE`, as root "
                             "after make images), loaded into local storage first: how a user without root builds")
    args = parser.parse_args(argv)
    try:
        bundle.check_registry(args.registry)
        if args.version is not None:
            version.oci_tag(args.version)
        if args.kustomize is None:
            raise bundle.ReleaseError("--kustomize is required: the kustomize that renders the manifests")
        if not (args.kustomize.is_file() and os.access(args.kustomize, os.X_OK)):
            raise bundle.ReleaseError(f"--kustomize {args.kustomize}: not an executable file")
        if args.bases is not None and not (args.bases.is_file() and os.access(args.bases, os.R_OK)):
            raise bundle.ReleaseError(f"--bases {args.bases}: not a readable file "
                                      "(python -m release.bases export FILE writes it)")
    except (bundle.ReleaseError, version.VersionError) as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    try:
        if args.bases is not None:
            bases.load(args.bases)
        bases.check()
    except bases.BasesError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    push = images.skopeo_push(f"docker://{args.registry}/{{name}}:{{tag}}", authfile=args.authfile,
                              tls_verify=not args.no_tls_verify)
    try:
        made = bundle.build_release(registry=args.registry, version=args.version, out_dir=args.out, push=push,
                                    kustomize=args.kustomize, images_archive=True)
    except (bundle.ReleaseError, version.VersionError) as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    shutil.copy(made.files["release.json"], bundle.REPO / "toolkit" / "data" / "release.json")
    for path in made.files.values():
        print(path)
    for name, ref in made.references.items():
        print(f"{name}: {ref}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
