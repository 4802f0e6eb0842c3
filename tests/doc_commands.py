"""The command blocks of docs/install.md and docs/operating.md, and what the test that runs them
(tests/e2e/test_the_install_docs_run.py) does with each.

A fenced block's language tag says what it is: `sh` (or `bash`, `console`) is commands a person
types; `yaml`, `python`, `json` and `text` are a file's or a program's text, never run. Each
command block is named by its page and its first line (`Block.key`) and is in exactly one of two
tables: RUN (run, in the pages' order, with the placeholders of PLACEHOLDERS put in) or NOT_RUN
(with the reason it is not run here, and where it is tested instead). A block in neither fails
tests/lint/test_doc_commands.py, so a doc cannot gain a command nobody runs.

A block runs one command at a time (a line, with the lines its trailing backslashes join to it),
each in `bash -c` in the same directory and environment, and each must exit 0 unless STATUS
allows another status for it, with the reason.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = ("docs/install.md", "docs/operating.md")
COMMAND_TAGS = ("sh", "bash", "console")
TEXT_TAGS = ("yaml", "python", "json", "text")
SHELL_TAG = "sh"  # the one tag the pages use for commands
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence
    tag: str
    text: str  # dedented to the fence's indent

    @property
    def key(self) -> tuple[str, str]:
        """(page, first line without its comment): how the tables below name the block."""
        first = self.text.splitlines()[0] if self.text else ""
        return self.page, re.sub(r"\s+#\s.*$", "", first).strip()

    @property
    def is_commands(self) -> bool:
        return self.tag in COMMAND_TAGS


def blocks(page: str, text: str | None = None) -> list[Block]:
    """Every fenced block of PAGE (its TEXT when given, else the file's), in order."""
    lines = (text if text is not None else (ROOT / page).read_text()).splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, tag = len(opening.group(1)), opening.group(2)
        end = next((j for j in range(i + 1, len(lines)) if FENCE.match(lines[j])), None)
        if end is None:
            raise ValueError(f"{page}:{i + 1}: a fence that is never closed")
        body = [line[indent:] if not line[:indent].strip() else line.lstrip() for line in lines[i + 1:end]]
        found.append(Block(page=page, line=i + 1, tag=tag, text="\n".join(body)))
        i = end + 1
    return found


def commands(block: Block) -> list[str]:
    """The block's commands: each line that is not blank or a comment, with the lines its
    trailing backslashes continue onto; a here-document is not split."""
    out: list[str] = []
    current: list[str] = []
    heredoc: str | None = None
    for line in block.text.splitlines():
        if heredoc is not None:
            current.append(line)
            if line.strip() == heredoc:
                out.append("\n".join(current))
                current, heredoc = [], None
            continue
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current.append(line)
        opens = re.search(r"<<-?\s*'?\"?(\w+)", line)
        if opens:
            heredoc = opens.group(1)
        elif not line.rstrip().endswith("\\"):
            out.append("\n".join(current))
            current = []
    if current:
        out.append("\n".join(current))
    return out


def command_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page) if b.is_commands]


INSTALL, OPERATING = PAGES

# The blocks run against the local cluster with the release installed.
RUN: frozenset[tuple[str, str]] = frozenset({
    (INSTALL, "kubectl apply --server-side -f controller.yaml"),
    (INSTALL, "kubectl get clustertrainingruntime torch-distributed -o yaml > rt.yaml"),
    (INSTALL, "kubectl label namespace training dispatch.phpboyscout.uk/identity=enabled"),
    (INSTALL, "kubectl apply --server-side -n training -f sidecar-rbac.yaml"),
    (INSTALL, "kubectl apply --server-side -f dispatcher.yaml"),
    (OPERATING, "kubectl create clusterrolebinding dispatch-metrics-reader \\"),
    (OPERATING, "toolkit list -A --foreign"),
    (OPERATING, "toolkit checkpoint latest /ckpt"),
    (OPERATING, "toolkit status llama-ft-7 -n training"),
    (OPERATING, "toolkit hold llama-ft-7 -n training"),
    (OPERATING, "kubectl get pods -n dispatch-system -l app.kubernetes.io/name=dispatch-controller"),
    (OPERATING, "kubectl logs -n dispatch-system deploy/dispatch-controller | grep '\"reconcile failed' | tail -3"),
    (OPERATING, ("kubectl describe pod -n tcab-dispatch -l app.kubernetes.io/name=tcab-dispatcher | grep -A1 "
                 "'Liveness probe failed'")),
    (OPERATING, "kubectl get jobs -n tcab-dispatch -l app.kubernetes.io/managed-by=test-cabinet-dispatcher \\"),
})

# The blocks not run here, each with the reason and where what it does is tested.
NOT_RUN: dict[tuple[str, str], str] = {
    (INSTALL, "podman login REGISTRY"):
        "builds both architectures' images and pushes them to a registry, minutes of build; "
        "tests/release/test_multiarch_release.py runs make release",
    (INSTALL, "make release-bases BASES=/srv/dispatch-bases.tar"):
        "runs as root and builds the image bases (make images); tests/e2e/test_the_release_built_without_root.py "
        "exports them and builds the release from them as another user",
    (INSTALL, "make release REGISTRY=HOST[:PORT][/PATH] BASES=/srv/dispatch-bases.tar"):
        "builds both architectures' images as a user without root, minutes of build; "
        "tests/e2e/test_the_release_built_without_root.py runs it",
    (INSTALL, "toolkit mirror dist/release --to registry.internal:5000/platform --out dist/release-internal \\"):
        "needs the release's images archive and a second registry; tests/release/test_mirror.py mirrors "
        "a release into a registry with TLS and a password",
    (INSTALL, "cat > values.yaml <<'EOF'"):
        "the chart installs the objects controller.yaml installed, which this cluster runs already; "
        "tests/release/test_chart.py installs and uninstalls the chart with helm",
    (OPERATING, "kubectl apply -f deployments/monitoring/servicemonitor.yaml"):
        "needs the Prometheus operator's CRDs, which the local cluster does not run; "
        "tests/controller/test_alerts_and_dashboard.py evaluates the rules and scrapes with the file's token",
    (OPERATING, "toolkit adopt llama-ft-7 -n training --reviewed 3f2a9c0d1e4b \\"):
        "needs a TrainJob the controller flagged foreign; tests/controller/test_adopt_takes_what_was_reviewed.py "
        "adopts one",
}

# Placeholders of the pages and what the run puts in their place; file names (controller.yaml,
# dispatcher.yaml, sidecar-rbac.yaml, ./service-token) are found in the directory the commands run
# in. Each value names a field of the run's `Values`.
PLACEHOLDERS: dict[str, str] = {
    "REGISTRY/dispatch/sidecar:TAG@sha256:DIGEST": "sidecar_image",  # the release's, from release.json
    "llama-ft-7": "trainjob",  # a TrainJob made by `toolkit start`
    "training": "namespace",  # the test's training namespace (a whole word)
    "/ckpt": "checkpoint_root",  # an empty checkpoint root
}


@dataclasses.dataclass(frozen=True)
class Values:
    sidecar_image: str
    trainjob: str
    namespace: str
    checkpoint_root: str


def substituted(command: str, values: Values) -> str:
    for placeholder, field in PLACEHOLDERS.items():
        command = re.sub(rf"(?<![\w.-]){re.escape(placeholder)}(?![\w-])", getattr(values, field), command)
    return command


# Commands allowed a status other than 0, by the start of the command as the page writes it.
STATUS: dict[str, tuple[int, str]] = {
    "kubectl describe pod -n tcab-dispatch": (1, "grep finds no failed probe on a dispatcher that runs"),
    "kubectl get jobs -n tcab-dispatch -l app.kubernetes.io/managed-by=test-cabinet-dispatcher \\\n"
    "  -o jsonpath": (1, "grep -c counts 0 unfinished driver Jobs, and exits 1 for it"),
}


def allowed_status(command: str) -> int:
    return next((status for start, (status, _) in STATUS.items() if command.startswith(start)), 0)
