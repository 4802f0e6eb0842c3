"""`toolkit cluster up|down|status`: the local cluster (devcluster/local.py).

The local cluster is a developer's tool beside the product, and the product
never imports it: this group reaches `toolkit` through the entry point group
`dispatch_k8s.toolkit_commands` (dev/pyproject.toml), which the toolkit's click
group loads by name when `toolkit cluster` is invoked.

Thin: each command calls one function and prints; a refusal is one line
(`toolkit cluster up: ...`, exit 1).
"""

from __future__ import annotations

import click

from toolkit import cli_errors


def _local():  # type: ignore[no-untyped-def]
    # Imported on use: `toolkit cluster --help` does not load the harness.
    from devcluster import local
    return local


@click.group("cluster", context_settings={"help_option_names": ["-h", "--help"]})
def cluster() -> None:
    """The local cluster: etcd, kube-apiserver and the real Trainer, JobSet and Kueue controllers.

    \b
    Example:
      eval "$(toolkit cluster up)"; kubectl get nodes; toolkit cluster down
    """


def _registry_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from devcluster import registry
    try:
        return registry.check_name(value)
    except registry.RegistryError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None


@cluster.command("up")
@click.option("--registry-name", default="registry.dispatch.test", show_default=True, callback=_registry_name,
              help="The name image references give the cluster's registry (a DNS name under .test).")
def up_cmd(registry_name: str) -> None:
    """Build (cached) and start the local cluster in the background; print the shell lines that use it.

    Prints `export KUBECONFIG=...` and `export PATH=...` (a directory holding the kubectl built
    from the cluster's own Kubernetes release): `eval "$(toolkit cluster up)"` sets both."""
    local = _local()
    try:
        started = local.up(registry_name=registry_name)
    except local.ClusterError as e:
        raise cli_errors.with_context(click.ClickException(str(e))) from None
    kubeconfig = started.kubeconfig
    if started.swept:
        click.echo(f"cleaned up after an earlier cluster first: {'; '.join(started.swept)}", err=True)
    click.echo(f"cluster up; logs in {kubeconfig.parent / 'logs'}; stop with `toolkit cluster down`", err=True)
    click.echo(f"our release installed from {started.release}: controller.yaml applied, its controller runs as "
               f"pods in dispatch-system ({started.leader} holds the Lease)", err=True)
    reg = started.registry
    click.echo(f"its registry {reg.name} is at {reg.endpoint}: podman push --authfile {reg.authfile} --cert-dir "
               f"{reg.cert_dir} IMAGE docker://{reg.endpoint}/REPOSITORY:TAG, then run {reg.name}/REPOSITORY@DIGEST",
               err=True)
    click.echo(f"export KUBECONFIG={kubeconfig}")
    click.echo(f'export PATH={kubeconfig.parent / "bin"}:"$PATH"')


@cluster.command("down")
def down_cmd() -> None:
    """Stop every process of the local cluster and remove its state."""
    local = _local()
    try:
        was_up = local.down()
    except local.ClusterError as e:
        raise cli_errors.with_context(click.ClickException(str(e))) from None
    click.echo("cluster down" if was_up else "no cluster was up", err=True)


@cluster.command("status")
def status_cmd() -> None:
    """Say whether the local cluster is up, and which components live (exit 1 if any is dead)."""
    local = _local()
    st = local.status()
    if not st.up:
        raise cli_errors.with_context(click.ClickException("no cluster is up (`toolkit cluster up`)"))
    click.echo(f"KUBECONFIG={st.kubeconfig}")
    click.echo(f"running: {', '.join(st.alive) or '-'}")
    click.echo(f"our controller's pods: {'; '.join(st.pods) or '-'}")
    if st.dead:
        raise cli_errors.with_context(click.ClickException(f"not running: {', '.join(st.dead)}"))
