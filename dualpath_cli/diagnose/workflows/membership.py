"""Membership: a dead engine, and a role with no serving engine, are incidents, not queues.

A pure function over :class:`~dualpath_cli.diagnose.model.Evidence`: it reads the membership
record (telemetry/membership.py) of the window's last view, the record ``status`` and
``/readyz`` read too, so the three agree on what serves.
"""

from __future__ import annotations

from dualpath_cli.diagnose.grading import CRITICAL, OK, WARNING, no_samples
from dualpath_cli.diagnose.model import Evidence, Finding
from dualpath_cli.telemetry.membership import Membership, NodeMember
from dualpath_cli.telemetry.view import ClusterView

__all__ = ["membership"]


def membership(ev: Evidence) -> list[Finding]:
    """CRITICAL per node whose engine is dead or restarting after a death, per
    crash-looping node (the launcher left its engine down) and per role with no serving
    engine at the end of the window; WARNING per node leaving or left on purpose while its
    role still serves (less capacity than configured, by an operator's hand); else what
    serves."""
    wf = "membership"
    if not ev.samples:
        return [no_samples(wf)]
    last = ev.samples[-1].view
    record = last.membership
    if record is None:  # a recording from before the record: nothing to judge by
        return [Finding(wf, OK, "membership not recorded in this window",
                        evidence={"pd": last.pd})]
    # the cluster says "starting" until every engine it has registered said hello: at
    # start-up, and also while an engine restarted after a death has not said hello yet
    # (the scheduler registers it again first). Only the first is no incident.
    if last.state == "starting" and not any(n.crash_loop or _is_down(n)
                                            for n in record.nodes):
        return [Finding(wf, OK, f"starting: {record.serving} of {record.of} serve so far",
                        evidence={"serving": record.serving, "of": record.of})]
    out = []
    for n in record.nodes:
        if n.crash_loop:
            out.append(Finding(
                wf, CRITICAL, f"node {n.name} is crash-looping: its {n.role} engine died "
                f"too often (restarted {n.restarts} times) and is left down",
                subject=f"node {n.name}",
                evidence={"node": n.name, "role": n.role, "state": n.state,
                          "restarts": n.restarts, "serving": record.serving,
                          "of": record.of},
                cause="its engine process died five times within 60 s (cluster.restart "
                      "stops restarting a crash loop); see the launcher's log for its exits",
                action="fix the cause in the launcher's log, then restart the cluster "
                       "(dualpath stop, then dualpath launch)"))
    out.extend(_down_node(wf, last, n) for n in record.nodes
               if not n.crash_loop and _is_down(n))
    for gap in record.missing:
        out.append(Finding(
            wf, CRITICAL, f"{gap.line()}: {record.serving} (of {record.of}) serve",
            subject=f"role {gap.role}",
            evidence={"role": gap.role, "since": gap.since, "why": gap.why,
                      "serving": record.serving, "of": record.of,
                      "nodes": {n.name: n.state for n in record.nodes}},
            cause=f"every {gap.role} node left or died; turns cannot finish and are "
                  "answered 503 after scheduler.no_engine_wait",
            action=f"start a {gap.role} node: dualpath launch --role {gap.role} --node NAME "
                   "--join HOST:PORT (or restart the cluster)",
            why=f"membership record of the window's last sample: no {gap.role} engine "
                f"serves ({record.serving} of {record.of} serve): CRITICAL (a fact: no "
                "minimum, no band)"))
    out += _left_nodes(record, last.state)
    if not out:
        out.append(Finding(wf, OK, f"{record.serving} serve (of {record.of})",
                           evidence={"serving": record.serving, "of": record.of}))
    return out


def _is_down(n: NodeMember) -> bool:
    """A node whose engine died and does not serve again yet: dead, or coming back after a
    death (a node joining for the first time is not down)."""
    if n.state in ("serving", "draining", "left"):
        return False
    return n.state == "dead" or n.restarting or n.down_since is not None


def _down_node(wf: str, view: ClusterView, n: NodeMember) -> Finding:
    """``node D1: decode engine 2 died 0.8 s ago, restarting (1 restart)``: CRITICAL while
    it is down (an engine lost is service lost, even while a peer serves its role)."""
    ids = [e.engine_id for e in view.engines if e.node == n.node]
    who = (f"{n.role} engine {', '.join(map(str, ids))}" if ids else f"its {n.role} engine")
    ago = (f" {max(0.0, view.at - n.down_since):.1f} s ago"
           if n.down_since is not None else "")
    now = ("restarting" if n.restarting or n.state == "joining" else "not restarted")
    times = f"{n.restarts} restart{'s' if n.restarts != 1 else ''}"
    return Finding(
        wf, CRITICAL, f"node {n.name}: {who} died{ago}, {now} ({times})",
        subject=f"node {n.name}",
        evidence={"node": n.name, "role": n.role, "state": n.state, "engines": ids,
                  "down_since": n.down_since, "restarting": n.restarting,
                  "restarts": n.restarts, "serving": n.serving},
        cause="its engine process exited or fell silent; its turns were re-queued to the "
              "engines that serve" + ("; the launcher restarts it with backoff "
                                      "(cluster.restart)" if now == "restarting" else ""),
        action=("wait for the restart (dualpath status shows it serving again); if it dies "
                "again, read the launcher's log for its exits" if now == "restarting" else
                "restart the cluster (dualpath stop, then dualpath launch), or set "
                "cluster.restart so the launcher restarts dead engines"),
        why=f"membership record of the window's last sample: node {n.name} is {n.state}"
            f"{', restarting' if n.restarting else ''}: CRITICAL while it is down (a fact: "
            "no minimum, no band)")


def _left_nodes(record: Membership, state: str) -> list[Finding]:
    """WARNING per node draining or left (not joined again) whose role other nodes still
    serve; a role it left empty is the CRITICAL role finding's, and the whole cluster
    stopping (its state ``draining``) is no node's doing."""
    if state == "draining":
        return []
    gone = {g.role for g in record.missing}
    out = []
    for n in record.leaving():
        if n.role in gone:
            continue
        doing = "is leaving (draining its turns)" if n.state == "draining" else "left"
        out.append(Finding(
            "membership", WARNING, f"node {n.name} {doing}: {record.serving} (of "
            f"{record.of}) serve", subject=f"node {n.name}",
            evidence={"node": n.name, "role": n.role, "state": n.state,
                      "serving": record.serving, "of": record.of},
            cause=f"it was stopped on purpose (Ctrl-C on its launcher, or DELETE "
                  f"/api/v1/join/{n.name}); other {n.role} nodes serve its share",
            action=f"start it again: dualpath launch --role {n.role} --node {n.name} "
                   "--join HOST:PORT",
            why=f"membership record of the window's last sample: node {n.name} is {n.state} "
                f"and other {n.role} engines serve: WARNING (a fact: no minimum, no band; "
                "CRITICAL only when no engine of its role is left)"))
    return out
