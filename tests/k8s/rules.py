"""Alert rules: extract them from a rendered PrometheusRule and check what they name.

    python rules.py extract RENDERED.yaml OUT.yaml   # the PrometheusRule's spec as a Prometheus rule file
    python rules.py same A.yaml B.yaml               # two rule files hold the same rules
    python rules.py names RULES.yaml                 # every metric an expr names is one the proxy,
                                                     # Prometheus (up) or kube-state-metrics exports
"""

from __future__ import annotations

import sys

import yaml

from common import ALL_METRICS, KUBE_STATE_METRICS, PROMETHEUS_METRICS, Checks, base_metric, fail, load_docs, promql_metric_names

EXPECTED_ALERTS = {
    "McpResumeGapRefusals": "mcp_resume_refusals_total",
    "McpResumeUpstreamLost": "mcp_resume_sessions_ended_total",
    "McpResumeInflightAborted": "mcp_resume_inflight_aborted_total",
    "McpResumeLogNearBound": "mcp_resume_log_max_bytes",
    "McpResumeStoreErrors": "mcp_resume_store_errors_total",
    "McpResumeStoreDamage": "mcp_resume_store_damage_total",
    "McpResumeTasksFailed": "mcp_resume_tasks_total",
    "McpResumeTakeovers": "mcp_resume_takeovers_total",
    "McpResumeFencedWrites": "mcp_resume_fenced_total",
    "McpResumeNoReadyReplicas": "up",
}


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (the exprs) as literal blocks, as a person would."""


_BlockDumper.add_representer(
    str,
    lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None),
)


def extract(rendered: str, out: str) -> int:
    rules = [d for d in load_docs(rendered) if d["kind"] == "PrometheusRule"]
    if len(rules) != 1:
        fail(f"{rendered}: want one PrometheusRule, found {len(rules)}")
    with open(out, "w") as f:
        f.write("# Alert rules of mcp-resume-proxy for a Prometheus without the Operator: the chart's\n"
                "# PrometheusRule rendered for release mcp-resume-proxy in namespace default. Adjust the\n"
                "# namespace/job/deployment matchers to your scrape config. Regenerate, don't edit:\n"
                "# see tests/k8s/README.md. Runbooks: charts/mcp-resume-proxy/README.md.\n")
        yaml.dump({"groups": rules[0]["spec"]["groups"]}, f, Dumper=_BlockDumper, sort_keys=False, width=1000)
    return 0


def same(a: str, b: str) -> int:
    with open(a) as fa, open(b) as fb:
        if yaml.safe_load(fa) != yaml.safe_load(fb):
            fail(f"{a} and {b} differ; regenerate {b} (see tests/k8s/README.md)")
    print(f"{a} == {b}")
    return 0


def names(path: str) -> int:
    with open(path) as f:
        groups = yaml.safe_load(f)["groups"]
    c = Checks(f"alert rule names ({path})")
    allowed = set(ALL_METRICS) | PROMETHEUS_METRICS | KUBE_STATE_METRICS
    seen = {}
    for group in groups:
        for rule in group["rules"]:
            used = {base_metric(n) for n in promql_metric_names(rule["expr"])}
            c.check(used <= allowed, f"{rule.get('alert')}: names only known metrics (unknown: {sorted(used - allowed)})")
            seen[rule.get("alert")] = used
    for alert, metric in EXPECTED_ALERTS.items():
        c.check(metric in seen.get(alert, set()), f"alert {alert} exists and uses {metric}")
    return c.done()


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    sys.exit({"extract": extract, "same": same, "names": names}[cmd](*rest))
