"""`toolkit executions` as text for people (cli_cluster.executions_table):
one row per execution in R order, the mark, the adoptions and the causes."""

from __future__ import annotations

from toolkit import adapter, cli_cluster, history


def _history() -> history.History:
    h = history.History()
    for a, j, uid, verdict in ((1, 0, "u1", "ok"), (1, 1, "u1", "ok"), (1, 0, "u2", "foreign: jobset-uid")):
        epoch, attempt = f"100000200000{a + j}", f"job.2.0.{a}.{j}"
        obs = history.Observation(a=a, j=j, jobset_uid=uid, epoch=epoch, attempt=attempt, pod=f"tj-node-0-0-{a}{j}",
                                  time="2026-12-04T10:00:00Z", ended=None, verdict=verdict)
        h = history.observe(h, obs) or h
    return h


def test_the_table_lists_each_execution_then_the_mark_and_the_causes():
    ex = adapter.Executions(namespace="ns", name="tj", state="running", history=_history(),
                            foreign_causes=["JobSet UID u2 is not the recorded u1: J may have been reset"],
                            foreign_dropped=2)
    lines = cli_cluster.executions_table(ex).split("\n")
    assert lines[0] == "trainjob ns/tj (running)"
    assert lines[1].split() == ["A", "J", "R", "EPOCH", "ATTEMPT", "FIRST", "SEEN", "FIRST", "POD", "ENDED", "VERDICT"]
    assert [line.split()[:3] for line in lines[2:5]] == [["1", "0", "1"], ["1", "0", "1"], ["1", "1", "2"]]
    assert lines[2].endswith(" ok") and lines[3].endswith("foreign: jobset-uid")  # the repeat beside its R
    assert lines[5:] == [
        "high-water R: 2",
        "foreign:",
        "  JobSet UID u2 is not the recorded u1: J may have been reset",
        "  ... and 2 more not kept (the list is bounded)",
    ]


def test_an_adoption_is_shown_with_its_reason_and_the_causes_it_cleared():
    h, _ = history.adopt(_history(), time="2026-12-04T11:00:00Z", reason="checked by a person",
                         causes=["a reset"], dropped=0, restarts=0, jobset_uid="u2")
    text = cli_cluster.executions_table(adapter.Executions(namespace="ns", name="tj", state="suspended", history=h,
                                                           foreign_causes=[], foreign_dropped=0))
    assert ("adopted 2026-12-04T11:00:00Z: checked by a person (high-water R 2, next A at least 3; "
            "1 cause(s) cleared)\n  cleared: a reset\nforeign: no") in text
