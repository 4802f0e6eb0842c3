"""`toolkit mirror`: a release's images copied into another registry, and its manifests for it
(`toolkit.mirror`). Exit 2 for a release or destination that cannot be used, 1 when skopeo or the
registry refuses, each in one line."""

from __future__ import annotations

import pathlib

import click

from toolkit import cli_errors


@click.command("mirror", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("release_dir", metavar="RELEASE_DIR", type=click.Path(file_okay=False, path_type=pathlib.Path))
@click.option("--to", "registry", required=True, metavar="REGISTRY",
              help="The registry to copy the images to, host[:port][/path], as the cluster's nodes name it.")
@click.option("--out", required=True, metavar="DIR", type=click.Path(file_okay=False, path_type=pathlib.Path),
              help="Where to write the manifests for REGISTRY (absent or empty).")
@click.option("--authfile", default=None, metavar="FILE", help="skopeo's (and podman's) auth file for REGISTRY.")
@click.option("--cert-dir", default=None, metavar="DIR", help="CA certificates (*.crt) for REGISTRY's TLS.")
@click.option("--tls-verify/--no-tls-verify", default=True, show_default=True,
              help="Require HTTPS with a certificate REGISTRY's name verifies.")
@cli_errors.user_errors
def mirror_cmd(release_dir: pathlib.Path, registry: str, out: pathlib.Path, authfile: str | None,
               cert_dir: str | None, tls_verify: bool) -> None:
    """Copy a release's images into REGISTRY, digests kept, and write its manifests for REGISTRY.

    RELEASE_DIR is what `make release` wrote (its images archive, release.json, SHA256SUMS). The
    images are copied byte for byte with skopeo, which must be installed; OUT gets the manifests,
    release.json and SHA256SUMS naming REGISTRY, and the chart (install it with
    `--set images.registry=REGISTRY`).

    \b
    Example:
      toolkit mirror ./release --to registry.internal:5000/platform --out ./release-internal \\
        --authfile ~/.config/containers/auth.json
    """
    from toolkit import mirror

    try:
        moved = mirror.mirror(release_dir, to=registry, out=out, authfile=authfile, cert_dir=cert_dir,
                              tls_verify=tls_verify)
    except mirror.CopyError as exc:
        cli_errors.fail(str(exc))
    for name, reference in sorted(moved.items()):
        click.echo(f"{name}: {reference}")
    click.echo(f"wrote {out}")
