"""Dashboard check.

    python dashboard.py DASHBOARD.json RULES_OUT.yaml

Checks the dashboard's structure (a `datasource` variable every panel uses, `$__rate_interval` in
every rate), that every query names only metrics the proxy exports (design.md §7 plus the
additions in common.py, and `up`), and that every exported metric is on some panel. It writes
each panel query, with Grafana's variables replaced, as a recording rule into RULES_OUT.yaml so
that `promtool check rules` proves each one parses.
"""

from __future__ import annotations

import json
import re
import sys

import yaml

from common import ALL_METRICS, PROMETHEUS_METRICS, Checks, base_metric, promql_metric_names

# Grafana's built-in interval variables and the dashboard's own variables, as PromQL would see them.
SUBSTITUTIONS = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
}

REQUIRED_TOPICS = {
    "refusals by reason": "mcp_resume_refusals_total",
    "resumes": "mcp_resume_resumes_total",
    "replayed events": "mcp_resume_replayed_events_total",
    "sessions": "mcp_resume_sessions_active",
    "events logged": "mcp_resume_events_logged_total",
    "events delivered": "mcp_resume_events_delivered_total",
    "append latency": "mcp_resume_log_append_seconds",
    "log bytes": "mcp_resume_log_bytes",
    "log bytes on disk": "mcp_resume_log_disk_bytes",
    "store errors": "mcp_resume_store_errors_total",
    "damaged log records": "mcp_resume_store_damage_total",
    "upstream errors": "mcp_resume_upstream_errors_total",
    "undeliverable messages": "mcp_resume_dropped_total",
    "sessions of another identity or face": "mcp_resume_auth_rejected_total",
    "requests rejected (origin, host, identity, media type)": "mcp_resume_requests_rejected_total",
    "tasks by status": "mcp_resume_tasks_total",
    "upstream pool sessions": "mcp_resume_upstream_pool_sessions",
}
# Rows the runbooks and READMEs send readers to.
REQUIRED_ROWS = ("Overview", "Resumption", "Sessions", "Event log", "Upstream", "Security", "2026-07-28 tasks")


def panels(dash: dict):
    for p in dash.get("panels", []):
        yield p
        yield from p.get("panels", [])


def main(path: str, out: str) -> int:
    with open(path) as f:
        dash = json.load(f)
    c = Checks(f"dashboard ({path})")
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    c.check(ds.get("type") == "datasource" and ds.get("query") == "prometheus",
            "a `datasource` template variable of type prometheus")
    c.check(dash.get("uid") and dash.get("title"), "dashboard has a uid and a title")

    allowed = set(ALL_METRICS) | PROMETHEUS_METRICS
    used: set[str] = set()
    rules = []
    ids = set()
    for p in panels(dash):
        if p.get("type") == "row":
            continue
        pid = p.get("id")
        c.check(pid not in ids, f"panel id {pid} is unique")
        ids.add(pid)
        title = p.get("title", f"panel {pid}")
        c.check(p.get("datasource", {}).get("uid") == "${datasource}", f"{title!r}: uses the datasource variable")
        c.check(p.get("description"), f"{title!r}: has a description (how to read it)")
        c.check(p.get("targets"), f"{title!r}: has queries")
        for t in p.get("targets", []):
            expr = t.get("expr", "")
            c.check(t.get("datasource", {}).get("uid") == "${datasource}", f"{title!r}/{t.get('refId')}: datasource variable")
            for fn in re.findall(r"\b(rate|irate|increase)\s*\(([^\[]*)\[([^\]]*)\]", expr):
                if fn[0] != "increase":
                    c.eq(fn[2], "$__rate_interval", f"{title!r}/{t.get('refId')}: {fn[0]}() uses $__rate_interval")
            names = {base_metric(n) for n in promql_metric_names(expr)}
            c.check(names, f"{title!r}/{t.get('refId')}: names a metric")
            c.check(names <= allowed, f"{title!r}/{t.get('refId')}: only exported metrics (unknown: {sorted(names - allowed)})")
            used |= names
            promql = expr
            for var, val in SUBSTITUTIONS.items():
                promql = promql.replace(var, val)
            c.check("$__" not in promql, f"{title!r}/{t.get('refId')}: no unknown Grafana interval variable")
            rules.append({"record": f"dashboard:panel_{pid}:{t.get('refId', 'A').lower()}", "expr": promql})

    for name, var in variables.items():
        if var.get("type") != "query":
            continue
        q = var["query"]["query"] if isinstance(var.get("query"), dict) else var.get("query", "")
        m = re.fullmatch(r"label_values\((.*),\s*([a-zA-Z_]+)\)", q.strip())
        if c.check(m, f"variable ${name}: a label_values() query"):
            names = {base_metric(n) for n in promql_metric_names(m.group(1))}
            c.check(names <= allowed, f"variable ${name}: only exported metrics ({sorted(names)})")
            rules.append({"record": f"dashboard:variable_{name}", "expr": m.group(1)})

    for metric in ALL_METRICS:
        c.check(metric in used, f"{metric} is on some panel")
    for topic, metric in REQUIRED_TOPICS.items():
        c.check(metric in used, f"topic {topic!r} shown ({metric})")
    c.check("up" in used, "proxies up is shown")
    rows = [p.get("title") for p in dash.get("panels", []) if p.get("type") == "row"]
    for r in REQUIRED_ROWS:
        c.check(r in rows, f"row {r!r} exists (rows: {rows})")
    failed = [t.get("expr", "") for p in panels(dash) for t in p.get("targets", [])
              if "mcp_resume_tasks_total" in t.get("expr", "") and 'status="failed"' in t.get("expr", "")]
    c.check(failed, "failed tasks have a panel of their own (alert McpResumeTasksFailed)")

    with open(out, "w") as f:
        yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}, f, sort_keys=False, width=1000)
    print(f"{len(rules)} queries written to {out}")
    return c.done()


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
