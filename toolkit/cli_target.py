"""What a cluster command acts on, spelled as kubectl spells it: one
decorator gives a command `--kubeconfig`, `--context`, `-n/--namespace` and,
where listing makes sense, `-A/--all-namespaces`, and hands it one `Target`.

- The namespace is resolved when the command runs, not when it is parsed,
  because it depends on the kubeconfig and context chosen
  (`toolkit.kubecontext`: the flag, then the context's namespace, then the
  pod's, then `default`).
- A TrainJob argument completes from the cluster (`complete_trainjob`): the
  names in the namespace resolved from what is typed so far. Completion
  never fails loudly: no cluster, no candidates.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import click

from toolkit import cli_errors, clusterconfig, kube, kubecontext


@dataclasses.dataclass(frozen=True)
class Target:
    kubeconfig: str | None
    context: str | None
    namespace: str  # resolved; ignored when all_namespaces
    all_namespaces: bool = False

    def client(self) -> kube.Client:
        try:
            return clusterconfig.load(kubeconfig=self.kubeconfig, context=self.context)
        except clusterconfig.ConfigError as exc:
            raise cli_errors.with_context(click.ClickException(f"--kubeconfig: {exc}")) from None

    @property
    def scope(self) -> str | None:
        """The namespace of a list (None: every namespace)."""
        return None if self.all_namespaces else self.namespace


def target_options(*, namespaced: bool = True,
                   all_namespaces: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the options and pass `target=Target(...)` instead of them. Not
    `namespaced`: only --kubeconfig and --context (the object names its own
    namespace, as a StartRequest does)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kubeconfig, context = kwargs.pop("kubeconfig"), kwargs.pop("context")
            given, every = kwargs.pop("namespace", None), kwargs.pop("all_namespaces", False)
            namespace = ""
            if namespaced:
                namespace = kubecontext.namespace(given=given, kubeconfig=kubeconfig, context=context)
            return fn(*args, target=Target(kubeconfig, context, namespace, every), **kwargs)

        if all_namespaces:
            wrapper = click.option("-A", "--all-namespaces", "all_namespaces", is_flag=True,
                                   help="Every namespace (the namespace options are then ignored).")(wrapper)
        if namespaced:
            wrapper = click.option(
                "-n", "--namespace", envvar="DISPATCH_NAMESPACE", default=None, metavar="NAMESPACE",
                help="Namespace (env DISPATCH_NAMESPACE; default: the kubeconfig context's namespace, "
                     "else `default`).")(wrapper)
        wrapper = click.option("--context", default=None, help="Kubeconfig context (default: the current one).")(wrapper)
        wrapper = click.option(
            "--kubeconfig", envvar="KUBECONFIG", default=None,
            help="Kubeconfig path (default: $KUBECONFIG; without it, the pod's ServiceAccount where "
                 "KUBERNETES_SERVICE_HOST is set, else ~/.kube/config).")(wrapper)
        return wrapper

    return decorate


def complete_trainjob(ctx: click.Context, param: click.Parameter,
                      incomplete: str) -> list[click.shell_completion.CompletionItem]:
    """The TrainJob names of the namespace meant so far that start with `incomplete`."""
    from toolkit import paths

    p = ctx.params
    try:
        namespace = kubecontext.namespace(given=p.get("namespace"), kubeconfig=p.get("kubeconfig"),
                                          context=p.get("context"))
        client = clusterconfig.load(kubeconfig=p.get("kubeconfig"), context=p.get("context"), retries=0)
        try:
            found, _ = client.list(paths.TRAINJOB, namespace=namespace)
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - completion offers nothing rather than an error in the shell
        return []
    names = sorted(str(tj["metadata"]["name"]) for tj in found)
    return [click.shell_completion.CompletionItem(n) for n in names if n.startswith(incomplete)]
