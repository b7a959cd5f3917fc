"""Checks a real /metrics scrape of the proxy (after `promtool check metrics` passed on it).

    python scrape.py METRICS.txt MAX_TOTAL_BYTES

Every fixed family of design.md §7 and the proxy's additions (common.py EXTRA_METRICS: log bound
and bytes on disk, store errors, damaged records, dropped messages, security refusals, tasks, upstream pool,
the shared log's fence, takeovers and forwards) is
exported with its type and label names; labelled families export their known label values from the start (so rates and alerts have
a series at 0 before the first event); mcp_resume_log_max_bytes is the configured
log.max_total_bytes; a fresh data dir has no store errors, no damaged records and its open segment
on disk.
"""

from __future__ import annotations

import re
import sys

from common import (ALL_METRICS, DROPPED_REASONS, ENDED_REASONS, FACADES, FORWARD_OUTCOMES, REDIS_OPS, REFUSAL_REASONS, REJECT_REASONS,
                    TASK_STATUSES, Checks)

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str):
    types: dict[str, str] = {}
    samples: list[tuple[str, dict[str, str], float]] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(None, 3)
            types[name] = typ.strip()
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            if m:
                labels = dict(LABEL.findall(m.group(2) or ""))
                samples.append((m.group(1), labels, float(m.group(3))))
    return types, samples


def main(path: str, max_total_bytes: str) -> int:
    with open(path) as f:
        types, samples = parse(f.read())
    c = Checks(f"scrape ({path})")
    for name, (typ, labels) in ALL_METRICS.items():
        if not c.eq(types.get(name), typ, f"{name} is exported as a {typ}"):
            continue
        series = [s for s in samples if s[0] == name or (typ == "histogram" and s[0] in (f"{name}_bucket", f"{name}_sum", f"{name}_count"))]
        c.check(series, f"{name} has samples")
        for sname, slabels, _ in series:
            keys = set(slabels) - ({"le"} if sname.endswith("_bucket") else set())
            c.eq(sorted(keys), sorted(labels), f"{sname} label names")
            break
    def values_of(name: str, label: str) -> set[str]:
        return {s[1].get(label) for s in samples if s[0] == name}
    c.check(set(REFUSAL_REASONS) <= values_of("mcp_resume_refusals_total", "reason"),
            f"mcp_resume_refusals_total exports every reason of design.md §4 from the start (has {sorted(values_of('mcp_resume_refusals_total', 'reason'))})")
    c.check(set(ENDED_REASONS) <= values_of("mcp_resume_sessions_ended_total", "reason"),
            f"mcp_resume_sessions_ended_total exports every end reason from the start (has {sorted(values_of('mcp_resume_sessions_ended_total', 'reason'))})")
    for fam in ("mcp_resume_resumes_total", "mcp_resume_sessions_started_total", "mcp_resume_client_streams_active",
                "mcp_resume_auth_rejected_total"):
        c.check(set(FACADES) <= values_of(fam, "facade"), f"{fam} exports both facades from the start (has {sorted(values_of(fam, 'facade'))})")
    for fam, label, known in (
        ("mcp_resume_dropped_total", "reason", DROPPED_REASONS),
        ("mcp_resume_requests_rejected_total", "reason", REJECT_REASONS),
        ("mcp_resume_tasks_total", "status", TASK_STATUSES),
        ("mcp_resume_forwards_total", "outcome", FORWARD_OUTCOMES),
    ):
        c.check(set(known) <= values_of(fam, label),
                f"{fam} exports every {label} from the start (has {sorted(values_of(fam, label))})")
    ops = {s[1].get("op") for s in samples if s[0] == "mcp_resume_redis_seconds_count"}
    c.check(set(REDIS_OPS) <= ops, f"mcp_resume_redis_seconds exports every op from the start (has {sorted(ops)})")
    c.eq([s[2] for s in samples if s[0] == "mcp_resume_redis_doorbell_up"], [0.0],
         "mcp_resume_redis_doorbell_up is 0 on the local backend")
    for fam in ("mcp_resume_fenced_total", "mcp_resume_takeovers_total"):
        c.eq([s[2] for s in samples if s[0] == fam], [0.0], f"{fam} is 0 on a fresh start")
    pool = [s[2] for s in samples if s[0] == "mcp_resume_upstream_pool_sessions"]
    c.eq(pool, [0.0], "mcp_resume_upstream_pool_sessions is 0 before any 2026-07-28 request")
    bound = [s[2] for s in samples if s[0] == "mcp_resume_log_max_bytes"]
    c.eq(bound, [float(max_total_bytes)], "mcp_resume_log_max_bytes is log.max_total_bytes")
    errors = [s[2] for s in samples if s[0] == "mcp_resume_store_errors_total"]
    c.eq(errors, [0.0], "mcp_resume_store_errors_total is 0 on a fresh data dir")
    damage = [s[2] for s in samples if s[0] == "mcp_resume_store_damage_total"]
    c.eq(damage, [0.0], "mcp_resume_store_damage_total is 0 on a fresh data dir")
    disk = [s[2] for s in samples if s[0] == "mcp_resume_log_disk_bytes"]
    live = [s[2] for s in samples if s[0] == "mcp_resume_log_bytes"]
    c.check(len(disk) == 1 and len(live) == 1 and disk[0] > 0 and disk[0] >= live[0],
            f"mcp_resume_log_disk_bytes counts the open segment and is at least mcp_resume_log_bytes (disk {disk}, live {live})")
    return c.done()


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
