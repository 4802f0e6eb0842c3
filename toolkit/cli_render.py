"""`toolkit render trainjob|runtime`: a TrainJob from a StartRequest, and a
runtime made ready for dispatch, printed as manifests.

Thin: each command reads its file (`toolkit.request`, `toolkit.yamlio`),
calls the pure renderer (`toolkit.render`) and prints. The output is YAML
(default) or JSON (`-o`); several documents are a YAML stream, or in JSON a
v1 List, as kubectl prints them; `--output-file` writes atomically
(`toolkit.cli_output.write_output`). A refusal is one line naming the file
(and the document, when there are several), exit 2. The renderer and the
YAML reader are imported when a command runs, not when the group lists it.
"""

from __future__ import annotations

from typing import Any

import click

from toolkit import cli_errors, cli_output


@click.group(cls=click.Group, context_settings={"help_option_names": ["-h", "--help"]})
def render() -> None:
    """Render a TrainJob from a StartRequest, or prepare a runtime.

    \b
    Examples:
      toolkit render trainjob examples/start-request.yaml --output-file trainjob.yaml
      toolkit render runtime torch_distributed.yaml --sidecar-image reg/sidecar:1.0
    """


def _file_hint(value: str) -> str:
    return f"to write a file, --output-file {value}"


manifest_format_option = cli_output.format_option(("yaml", "json"), default="yaml", hint=_file_hint)


def write_manifests(docs: list[Any], *, output: str, output_file: str | None) -> None:
    """One document as itself; several as a YAML stream, or in json a v1 List (as kubectl prints them)."""
    if output == "json":
        data = docs[0] if len(docs) == 1 else {"apiVersion": "v1", "kind": "List", "items": docs}
        cli_output.write_output(cli_output.dumps("json", data), output_file)
        return
    from toolkit import yamlio

    cli_output.write_output(yamlio.dump_all(docs), output_file)


@render.command("trainjob")
@click.argument("request_file", metavar="REQUEST")
@manifest_format_option
@cli_output.output_file_option
@cli_errors.user_errors
def render_trainjob(request_file: str, output: str, output_file: str | None) -> None:
    """Render the suspended TrainJob for a StartRequest (YAML, or JSON by .json; - is stdin).

    \b
    Example:
      toolkit render trainjob examples/start-request.yaml --output-file trainjob.yaml
    """
    from toolkit import render as render_mod
    from toolkit import request

    req = request.load(request_file)
    write_manifests([render_mod.trainjob(req)], output=output, output_file=output_file)


@render.command("runtime")
@click.argument("runtime_file", metavar="RUNTIME")
@manifest_format_option
@cli_output.output_file_option
@click.option("--sidecar-image", metavar="IMAGE", default=None,
              help="The sidecar verifier's image (default: the recorded release's, REGISTRY/dispatch/sidecar:TAG@sha256:...).")
@click.option(
    "--service-account", metavar="NAME", default=None,
    help="The ServiceAccount the pods run as (default: the runtime's own, else the namespace's default); "
         "it needs the sidecar's rights (sidecar-rbac.yaml binds default and dispatch-sidecar).")
@cli_errors.user_errors
def render_runtime(runtime_file: str, output: str, output_file: str | None, sidecar_image: str | None, service_account: str | None) -> None:
    """Add restartPolicy Never, backoffLimit 0 and the sidecar to a (Cluster)TrainingRuntime.

    Every document of RUNTIME is rendered; the output is idempotent (render
    it again and nothing changes). Failure policies are left as they are:
    check them with `toolkit check-runtime`.

    \b
    Example:
      toolkit render runtime torch_distributed.yaml --output-file torch_distributed.dispatch.yaml
    """
    from toolkit import render as render_mod
    from toolkit import yamlio

    docs = yamlio.load_documents(runtime_file)
    out = []
    for i, doc in enumerate(docs):
        try:
            out.append(
                render_mod.runtime(
                    doc,
                    sidecar_image=sidecar_image,
                    service_account=service_account,
                )
            )
        except render_mod.RenderError as exc:
            where = f"{runtime_file}" + (f" (document {i + 1})" if len(docs) > 1 else "")
            cli_errors.bad_input(f"{where}: {exc}")
    write_manifests(out, output=output, output_file=output_file)
