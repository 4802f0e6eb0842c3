"""`toolkit start|open|hold|release|status|executions|list|adopt`: the
adapter operations against a cluster.

Kubectl-shaped: each command names its cluster and namespace with the
options `toolkit.cli_target` gives it (the namespace from the kubeconfig
context when -n is not given; -A where a list makes sense), and prints in
the format `-o` names (`toolkit.cli_output`: the table, json or yaml).

Thin commands: parse, call `toolkit.adapter`, print. A refusal
(`adapter.AdapterError`, a bound, an API refusal) is one line on stderr and
exit 1; bad input is exit 2 (click's usage errors). The controller's own
command lives with the controller (`controller.cli`).
Loaded lazily by `toolkit.cli`, so `toolkit wrap` never imports the
kubernetes client.
"""

from __future__ import annotations

import datetime
import functools
import re
from collections.abc import Callable
from typing import Any

import click

from toolkit import adapter, cli_errors, cli_output, cli_target, flagmark, kube, listing


def _refusal(message: str) -> click.ClickException:
    """Exit 1 with one line that names the command (`toolkit open: ...`)."""
    return cli_errors.with_context(click.ClickException(message))


def _refusals(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a refusal into one line and exit 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except adapter.AdapterError as exc:
            raise _refusal(str(exc)) from None
        except kube.ApiError as exc:
            raise _refusal(f"the apiserver refused: {exc}") from None

    return wrapper


@click.command("start")
@click.argument("request_file", metavar="REQUEST", type=click.Path(dir_okay=False))
@cli_target.target_options(namespaced=False)
@_refusals
def start_cmd(request_file: str, target: cli_target.Target) -> None:
    """Check the runtime on the cluster, then create the TrainJob of REQUEST
    (a StartRequest file, YAML or JSON) suspended with A = 0. A second start
    of the same job and submission finds it and changes nothing.

    \b
    Example:
      toolkit start examples/start-request.yaml --kubeconfig ~/.kube/config
    """
    from toolkit import render, request  # pure; loaded only for start

    try:
        req = request.load(request_file)
    except ValueError as exc:  # RequestError and LoadError: one line naming the field
        raise click.BadParameter(str(exc), param_hint="REQUEST") from None
    started = adapter.start(
        target.client(), trainjob=render.trainjob(req), allow_rank_restart=req.allow_rank_restart
    )
    verb = "created" if started.created else "exists, unchanged"
    click.echo(f"trainjob {started.namespace}/{started.name} {verb}")


def _raise_command(name: str, op: Callable[..., adapter.Raised], doc: str) -> click.Command:
    @click.command(name, help=doc)
    @click.argument("trainjob", shell_complete=cli_target.complete_trainjob)
    @cli_target.target_options()
    @_refusals
    def cmd(trainjob: str, target: cli_target.Target) -> None:
        namespace = target.namespace
        raised = op(target.client(), namespace=namespace, name=trainjob)
        if raised.requeued:  # Kueue mode's release: the check raises A at the next admission
            click.echo(f"trainjob {namespace}/{trainjob} released: Workload {', '.join(raised.requeued)} "
                       f"spec.active true; Kueue admits it again through the check, which raises A above "
                       f"{raised.admission}")
        else:
            click.echo(f"trainjob {namespace}/{trainjob} running with A = {raised.admission}")
        if raised.jobset_reset:
            click.echo(f"warning: flagged foreign: {raised.jobset_reset}", err=True)
        if raised.conflicts:
            click.echo(f"({raised.conflicts} conflicting writes re-read and retried)", err=True)

    return cmd


open_cmd = _raise_command(
    "open", adapter.open_, "Plain mode: raise A and unsuspend TRAINJOB in one preconditioned update."
    "\n\n\b\nExample:\n  toolkit open llama-ft-7 -n training"
)
release_cmd = _raise_command(
    "release", adapter.release, "Resume a held TRAINJOB; refused while pods of the held execution still run"
    " (they would be left below the raised floor). Plain mode: A is raised in the update that unsuspends."
    " Kueue mode: its Workload is set spec.active true, and Kueue admits it again through the admission"
    " check, which raises A."
    "\n\n\b\nExample:\n  toolkit release llama-ft-7 -n training"
)


@click.command("hold")
@click.argument("trainjob", shell_complete=cli_target.complete_trainjob)
@cli_target.target_options()
@_refusals
def hold_cmd(trainjob: str, target: cli_target.Target) -> None:
    """Hold TRAINJOB: its pods stop, and A is raised before it runs again.
    Plain mode: spec.suspend true (the next open or release raises A). Kueue
    mode: its Workload's spec.active false, Kueue's own hold (Kueue evicts it
    and suspends the TrainJob; release sets it true again); refused while Kueue
    has not made its Workload.

    \b
    Example:
      toolkit hold llama-ft-7 -n training
    """
    namespace = target.namespace
    held = adapter.holding(target.client(), namespace=namespace, name=trainjob)
    where = f"trainjob {namespace}/{trainjob}"
    if held.workloads:
        workloads = ", ".join(held.workloads)
        click.echo(f"{where} held: Workload {workloads} spec.active false; Kueue evicts it and suspends the TrainJob"
                   if held.changed else f"{where} was already held (Workload {workloads} spec.active false)")
    else:
        click.echo(f"{where} {'held' if held.changed else 'was already suspended'}")


def status_table(st: adapter.Status) -> str:
    """The status as text: one `key  value` row each."""
    which = f"{st.execution} execution"
    rows = [
        ("trainjob", f"{st.namespace}/{st.name}"),
        ("state", st.state),
        (f"A ({which})", str(st.admission)),
        (f"J ({which})", str(st.restarts)),
        (f"R ({which})", str(st.r)),
        (f"epoch ({which})", st.epoch or (f"- ({st.bound})" if st.bound else "-")),
        (f"attempt ({which})", st.attempt or "-"),
        ("last A written", str(st.last_admission)),
        ("floor", "-" if st.floor is None else str(st.floor)),
        ("high-water R", str(st.high_water)),
        ("jobset uid (recorded)", st.jobset_uid or "-"),
        ("jobset uid (seen)", (st.jobset_uid_seen or "-") + (" (MISMATCH)" if st.jobset_uid_mismatch else "")),
        ("foreign", "yes" if st.foreign else "no"),
    ]
    if st.foreign_cause:
        rows += [("cause", line) for line in st.foreign_cause.split("\n")]
    if st.foreign_dropped:
        rows.append(("cause", f"... and {st.foreign_dropped} more not kept (the list is bounded)"))
    if st.foreign_fingerprint:
        rows.append(("causes reviewed as", f"{st.foreign_fingerprint} (toolkit adopt --reviewed {st.foreign_fingerprint})"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


@click.command("status")
@click.argument("trainjob", shell_complete=cli_target.complete_trainjob)
@cli_target.target_options()
@cli_output.format_option()
@_refusals
def status_cmd(trainjob: str, target: cli_target.Target, output: str) -> None:
    """State of TRAINJOB, and A, J, R, epoch and attempt of one execution: the
    current one while it runs, the next one while it is suspended (each row
    says which). Also the floor, the high-water mark of R, the recorded JobSet
    UID and the foreign flag with its causes.

    It writes, as open and release do: the first time it sees the TrainJob's
    JobSet it records its UID on the TrainJob, and a JobSet whose UID is not
    the recorded one flags the TrainJob foreign (annotation, label and a
    Warning Event). Without update rights on TrainJobs it writes nothing and
    only shows the mismatch.

    \b
    Example:
      toolkit status llama-ft-7 -n training -o yaml
    """
    st = adapter.status(target.client(), namespace=target.namespace, name=trainjob)
    cli_output.emit(output, st.as_dict(), table=lambda: status_table(st))


def executions_table(ex: adapter.Executions) -> str:
    """The history as text: one row per execution, oldest first, then the
    high-water mark, the adoptions and the foreign causes."""
    h = ex.history
    header = ("A", "J", "R", "EPOCH", "ATTEMPT", "FIRST SEEN", "FIRST POD", "ENDED", "VERDICT")
    rows = [header] + [
        (str(e.a), str(e.j), str(e.r), e.epoch or "-", e.attempt or "-", e.first_seen, e.first_pod,
         e.ended or "-", e.verdict)
        for e in h.executions
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [f"trainjob {ex.namespace}/{ex.name} ({ex.state})"]
    if h.unreadable:
        lines.append("history: unreadable (not written by dispatch): kept as found and flagged; "
                     "nothing is recorded until a person repairs or removes it")
    if h.dropped:
        lines.append(f"({h.dropped} older execution(s) not kept)")
    lines += ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.append(f"high-water R: {h.high_water}")
    for d in h.adoptions:
        lines.append(f"adopted {d.time}: {d.reason} (high-water R {d.high_water}, next A at least {d.minimum}; "
                     f"{len(d.causes)} cause(s) cleared)")
        lines += [f"  cleared: {c}" for c in d.causes]
    if ex.foreign_causes or ex.foreign_dropped:
        lines.append("foreign:")
        lines += [f"  {c}" for c in ex.foreign_causes]
        if ex.foreign_dropped:
            lines.append(f"  ... and {ex.foreign_dropped} more not kept (the list is bounded)")
    if ex.foreign_fingerprint:
        if not (ex.foreign_causes or ex.foreign_dropped):
            lines.append("foreign: (its causes could not be kept on the TrainJob: see its Warning Events)")
        lines.append(f"  causes reviewed as {ex.foreign_fingerprint} (toolkit adopt --reviewed {ex.foreign_fingerprint})")
    elif not (ex.foreign_causes or ex.foreign_dropped):
        lines.append("foreign: no")
    return "\n".join(lines)


def list_table(rows: list[listing.Row], *, every: bool, now: datetime.datetime | None = None) -> str:
    """The rows as kubectl prints a list (a NAMESPACE column with -A)."""
    header = ["NAME", "STATE", "MODE", "A", "EXECUTIONS", "HIGH-WATER R", "FOREIGN", "AGE"]
    table = [(["NAMESPACE"] if every else []) + header]
    for r in rows:
        cells = [r.name, r.state, r.mode, str(r.admission), str(r.executions), str(r.high_water),
                 f"yes ({r.causes})" if r.foreign else "no", _age(r.created, now=now)]
        table.append(([r.namespace] if every else []) + cells)
    return cli_output.columns(table)


def _age(created: str, *, now: datetime.datetime | None = None) -> str:
    """A short age (45s, 12m, 5h, 3d) of an apiserver timestamp, as kubectl prints one."""
    try:
        then = datetime.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        return "-"
    seconds = max(0, int(((now or datetime.datetime.now(datetime.timezone.utc)) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size or (unit == "m" and seconds >= size):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _list(target: cli_target.Target, *, foreign: bool, selector: str | None, output: str) -> None:
    rows = listing.rows(target.client(), namespace=target.scope, foreign=foreign, label_selector=selector)
    if not rows and output == cli_output.TABLE:
        where = "any namespace" if target.all_namespaces else f"namespace {target.namespace}"
        click.echo(f"no {'flagged ' if foreign else ''}dispatch TrainJobs found in {where}", err=True)
        return
    cli_output.emit(output, {"items": [r.as_dict() for r in rows]},
                    table=lambda: list_table(rows, every=target.all_namespaces))


_foreign_option = click.option("--foreign", is_flag=True,
                               help=f"Only the TrainJobs flagged foreign (label {flagmark.SELECTOR}).")
_selector_option = click.option("-l", "--selector", default=None, metavar="SELECTOR",
                                help="A label selector as kubectl takes it (ANDed with --foreign).")


@click.command("list")
@cli_target.target_options(all_namespaces=True)
@_foreign_option
@_selector_option
@cli_output.format_option()
@_refusals
def list_cmd(target: cli_target.Target, foreign: bool, selector: str | None, output: str) -> None:
    """The dispatch TrainJobs of a namespace (or of all, -A): state, mode, the
    A last written, executions recorded, the high-water mark of R and the
    foreign flag. Reads only (one paged list of TrainJobs).

    \b
    Examples:
      toolkit list -A --foreign
      toolkit list -n training -o yaml
      kubectl get trainjobs -A -l dispatch.phpboyscout.uk/foreign=true   # the same flagged ones
    """
    _list(target, foreign=foreign, selector=selector, output=output)


@click.command("executions")
@click.argument("trainjob", required=False, shell_complete=cli_target.complete_trainjob)
@cli_target.target_options(all_namespaces=True)
@_foreign_option
@_selector_option
@cli_output.format_option()
@_refusals
def executions_cmd(trainjob: str | None, target: cli_target.Target, foreign: bool, selector: str | None,
                   output: str) -> None:
    """Every execution of TRAINJOB the controller recorded (A, J, R, epoch,
    attempt, first pod, how it ended, verdict), the high-water mark of R, the
    adoptions and the foreign causes. Without TRAINJOB, the list of TrainJobs
    (as `toolkit list`). Reads only.

    \b
    Examples:
      toolkit executions llama-ft-7 -n training
      toolkit executions -A --foreign
    """
    if trainjob is None:
        _list(target, foreign=foreign, selector=selector, output=output)
        return
    if target.all_namespaces:
        raise click.UsageError("a TrainJob is named in one namespace: give -n NAMESPACE, not -A")
    if foreign or selector:
        raise click.UsageError("--foreign and -l select TrainJobs to list: give them without TRAINJOB")
    ex = adapter.executions(target.client(), namespace=target.namespace, name=trainjob)
    cli_output.emit(output, ex.as_dict(), table=lambda: executions_table(ex))


@click.command("adopt")
@click.argument("trainjob", shell_complete=cli_target.complete_trainjob)
@click.option("--reason", required=True, help="Why the TrainJob may run again (kept in its history and an Event).")
@click.option("--reviewed", required=True, metavar="FINGERPRINT",
              help="The fingerprint of the causes you reviewed, as `toolkit status` and `toolkit executions` print "
                   "it (12 hex digits); refused when the causes have changed since.")
@click.option("--check", "checks", multiple=True, metavar="NAME",
              help="Kueue mode: the AdmissionCheck(s) of ours to set Retry (repeatable). "
                   "Default: every AdmissionCheck whose controllerName is --controller-name.")
@click.option("--controller-name", default=adapter.CHECK_CONTROLLER_NAME, show_default=True,
              help="The AdmissionCheck controllerName our controller serves (its --controller-name).")
@cli_target.target_options()
@_refusals
def adopt_cmd(trainjob: str, reason: str, reviewed: str, checks: tuple[str, ...], controller_name: str,
              target: cli_target.Target) -> None:
    """Clear the foreign flag of TRAINJOB after a person has judged it: the
    causes and REASON go into its history, the flag's annotations and label
    are removed, the current JobSet UID is recorded, and the next execution's
    R is set above the high-water mark (a running TrainJob is held in plain
    mode, re-queued through the check in Kueue mode). Refused unless the
    TrainJob is ours and flagged with the causes REVIEWED (a cause flagged
    since changes the fingerprint), or past the R bound.

    \b
    Example:
      toolkit status llama-ft-7 -n training     # the causes, and: causes reviewed as 3f2a9c0d1e4b
      toolkit adopt llama-ft-7 -n training --reviewed 3f2a9c0d1e4b \\
        --reason "JobSet deleted by hand; checkpoints verified"
    """
    namespace = target.namespace
    if not reason.strip():
        raise click.BadParameter("empty; say what was checked and why the TrainJob may run again",
                                 param_hint="--reason")
    if not re.fullmatch(r"[0-9a-f]{12}", reviewed.strip().lower()):
        raise click.BadParameter(f"{reviewed!r} is not a fingerprint: 12 hex digits, as `toolkit status` prints "
                                 "them", param_hint="--reviewed")
    done = adapter.adopt(target.client(), namespace=namespace, name=trainjob, reason=reason,
                         reviewed=reviewed.strip().lower(),
                         checks=set(checks) if checks else None, controller_name=controller_name)
    click.echo(f"trainjob {namespace}/{trainjob} adopted: {len(done.causes)} cause(s) cleared and kept in its history")
    epoch = f", epoch {done.next_epoch}" if done.next_epoch else ""
    click.echo(f"next execution: A {done.minimum}, R {done.next_r}{epoch} (above the high-water R {done.high_water})")
    if done.held:
        click.echo(f"held: run `toolkit release {trainjob} -n {namespace}` once its pods have stopped", err=True)
    elif done.requeued:
        click.echo(f"re-queued through the admission check: {', '.join(done.requeued)}", err=True)
    elif done.running:
        click.echo("warning: still running and no admitted Workload with our check was found to re-queue; "
                   "until its next admission, a JobSet restart starts with the same A", err=True)
