"""The release: versioned, digest-pinned images and one install manifest per part.

`version` says what a build is called (the package version at a release, the version plus the
commit between releases) and the OCI tag it is pushed under; `images` builds the images with
their OCI labels; `bundle` pushes them and renders the kustomize sources into install manifests
whose every image reference is REGISTRY/NAME:TAG@sha256:DIGEST. `python -m release` is what
`make release` runs.
"""
