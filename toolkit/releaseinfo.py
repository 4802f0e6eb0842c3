"""This installation's release: the image references `make release` recorded.

`make release` (release/__main__.py) writes toolkit/data/release.json beside this module: the
release's version and, per image, REGISTRY/dispatch/NAME:TAG@sha256:DIGEST. A wheel built from that
checkout carries it, so its `toolkit render runtime` defaults the sidecar to the release's own
image, which any node that can pull from the release's registry can pull. An installation with no
release recorded (a development checkout) has no default: the sidecar image must be given.
"""

from __future__ import annotations

import json
import pathlib

FILE = pathlib.Path(__file__).resolve().parent / "data" / "release.json"
SIDECAR = "sidecar"


def images(path: pathlib.Path | None = None) -> dict[str, str]:
    """Image name -> pinned reference of the release recorded in PATH (FILE); empty when none is."""
    path = path or FILE
    try:
        recorded = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return {str(k): str(v) for k, v in dict(recorded.get("images") or {}).items()}


def sidecar_image(path: pathlib.Path | None = None) -> str | None:
    """The recorded release's sidecar image, or None."""
    return images(path).get(SIDECAR)
