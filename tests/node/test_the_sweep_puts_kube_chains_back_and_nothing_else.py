"""What the sweep does to iptables (`node.restore_iptables`), in both families, on the kernel's
own tables: in a network namespace of its own (`unshare --net`), so the host's are not touched
and no other node on the host can change them meanwhile.

Given the rules as they were before a node started (the host's own KUBE- chains among them) and
changes as a kubelet and kube-proxy make them (new KUBE- chains, jumps to them from built-in
chains, a KUBE- chain of the host's rewritten, another one deleted), plus changes made meanwhile
by someone else (a chain and a rule of podman's), the sweep leaves the KUBE- chains and every rule
in or to them as they were before, and the rest as it is now (a table iptables-nft made for the
node's rules, with its built-in chains, stays, empty: no tool the host has deletes a table).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]

INSIDE = r"""
import subprocess, sys
from devcluster import node

family = sys.argv[1]
BUILT_IN = ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING")

def ipt(*args):
    subprocess.run([family, "-w", *args], check=True, capture_output=True)

# The host's own: as a host that is (or was) a Kubernetes node has them.
ipt("-t", "filter", "-N", "KUBE-HOST-OWN")
ipt("-t", "filter", "-A", "KUBE-HOST-OWN", "-p", "tcp", "--dport", "9", "-j", "RETURN")
ipt("-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", "9", "-j", "KUBE-HOST-OWN")
ipt("-t", "nat", "-N", "KUBE-SERVICES")
ipt("-t", "nat", "-A", "KUBE-SERVICES", "-p", "tcp", "--dport", "9", "-j", "RETURN")
ipt("-t", "nat", "-N", "KUBE-SVC-OLD")
ipt("-t", "nat", "-A", "KUBE-SVC-OLD", "-j", "RETURN")
before = node.iptables_state(family)

# A node: chains of its own, jumps to them, a chain of the host's rewritten, another deleted.
ipt("-t", "filter", "-N", "KUBE-FIREWALL")
ipt("-t", "filter", "-A", "KUBE-FIREWALL", "-m", "comment", "--comment", "block incoming localnet connections",
    "-p", "tcp", "--dport", "7", "-j", "DROP")
ipt("-t", "filter", "-I", "INPUT", "-j", "KUBE-FIREWALL")
ipt("-t", "filter", "-A", "OUTPUT", "-j", "KUBE-FIREWALL")
ipt("-t", "mangle", "-N", "KUBE-KUBELET-CANARY")
ipt("-t", "nat", "-N", "KUBE-SVC-NEW")
ipt("-t", "nat", "-A", "KUBE-SVC-NEW", "-j", "RETURN")
ipt("-t", "nat", "-F", "KUBE-SERVICES")
ipt("-t", "nat", "-A", "KUBE-SERVICES", "-j", "KUBE-SVC-NEW")
ipt("-t", "nat", "-A", "OUTPUT", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES")
ipt("-t", "nat", "-F", "KUBE-SVC-OLD")
ipt("-t", "nat", "-X", "KUBE-SVC-OLD")
# Someone else, meanwhile.
ipt("-t", "filter", "-N", "NETAVARK-FORWARD")
ipt("-t", "filter", "-A", "FORWARD", "-j", "NETAVARK-FORWARD")
after_others = node.iptables_state(family)

changed = node.restore_iptables(family, before)
assert changed, changed
now = node.iptables_state(family)
expected = {t: dict(c) for t, c in before.items()}
expected.setdefault("filter", {})["NETAVARK-FORWARD"] = []
expected["filter"]["FORWARD"] = before["filter"].get("FORWARD", []) + ["-j NETAVARK-FORWARD"]
for table in ("filter", "nat", "mangle"):
    for chain, rules in now.get(table, {}).items():
        want = expected.get(table, {}).get(chain)
        if want is None and chain in BUILT_IN and not rules:
            continue  # a table iptables-nft made for the node stays, empty: no tool here deletes one
        assert want is not None, (table, chain, rules)
        assert sorted(rules) == sorted(want), (table, chain, rules, want)
    for chain in expected.get(table, {}):
        assert chain in now.get(table, {}), (table, chain)
assert node.restore_iptables(family, before) == []  # nothing left to do
print("ok")
"""


def test_kube_chains_back_as_before_and_others_changes_kept() -> None:
    for family in ("iptables", "ip6tables"):
        done = subprocess.run(["unshare", "--net", sys.executable, "-c", INSIDE, family], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 0 and done.stdout.strip() == "ok", (family, done.stdout, done.stderr)
