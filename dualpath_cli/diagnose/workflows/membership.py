"""Membership: a role with no serving engine is an incident, not a queue.

A pure function over :class:`~dualpath_cli.diagnose.model.Evidence`: it reads the membership
record (telemetry/membership.py) of the window's last view, the record ``status`` and
``/readyz`` read too, so the three agree on what serves.
"""

from __future__ import annotations

from dualpath_cli.diagnose.grading import CRITICAL, OK, no_samples
from dualpath_cli.diagnose.model import Evidence, Finding

__all__ = ["membership"]


def membership(ev: Evidence) -> list[Finding]:
    """CRITICAL per crash-looping node (the launcher left its engine down) and per role with
    no serving engine at the end of the window; else what serves."""
    wf = "membership"
    if not ev.samples:
        return [no_samples(wf)]
    last = ev.samples[-1].view
    record = last.membership
    if record is None:  # a recording from before the record: nothing to judge by
        return [Finding(wf, OK, "membership not recorded in this window",
                        evidence={"pd": last.pd})]
    if last.state == "starting":
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
    if not out:
        out.append(Finding(wf, OK, f"{record.serving} serve (of {record.of})",
                           evidence={"serving": record.serving, "of": record.of}))
    return out
