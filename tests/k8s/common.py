"""Shared facts and helpers of the Kubernetes kit checks (run by scripts/check-k8s).

The metric names, types and labels below are design.md §7's fixed contract, plus the proxy's own
additions (src/metrics.rs): `mcp_resume_log_max_bytes` (the configured `log.max_total_bytes`,
exported so alerts can use a ratio), `mcp_resume_log_disk_bytes` (the log's segment files on
disk), `mcp_resume_store_errors_total` (design.md §10: failed writes, syncs or file operations of
the log), `mcp_resume_store_damage_total` (design.md §10b: damaged records found in the log),
`mcp_resume_dropped_total`, the security counters of design.md §11
(`mcp_resume_requests_rejected_total`, `mcp_resume_auth_rejected_total`) and the 2026-07-28 face's
of §12 (`mcp_resume_tasks_total`, `mcp_resume_upstream_pool_sessions`) and the shared log's of
§13 (`mcp_resume_fenced_total`, `mcp_resume_takeovers_total`, `mcp_resume_forwards_total`,
`mcp_resume_redis_seconds`, `mcp_resume_redis_doorbell_up`). When ../shared/design.md
is present, `design_metrics()` reads the table and the checks compare it with this copy, so the
two cannot drift apart unnoticed.
"""

from __future__ import annotations

import copy
import os
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "mcp-resume-proxy"

# name -> (type, label names)
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mcp_resume_refusals_total": ("counter", ("reason",)),
    "mcp_resume_resumes_total": ("counter", ("facade",)),
    "mcp_resume_replayed_events_total": ("counter", ()),
    "mcp_resume_events_logged_total": ("counter", ()),
    "mcp_resume_events_delivered_total": ("counter", ()),
    "mcp_resume_log_append_seconds": ("histogram", ()),
    "mcp_resume_log_bytes": ("gauge", ()),
    "mcp_resume_sessions_active": ("gauge", ()),
    "mcp_resume_sessions_started_total": ("counter", ("facade",)),
    "mcp_resume_sessions_ended_total": ("counter", ("reason",)),
    "mcp_resume_inflight_aborted_total": ("counter", ()),
    "mcp_resume_upstream_errors_total": ("counter", ("kind",)),
    "mcp_resume_client_streams_active": ("gauge", ("facade",)),
}
# Not in design.md §7's table: the configured bound of mcp_resume_log_bytes, the log's bytes on
# disk (live records, dead ones not yet compacted, headers), the storage failures of §10, the
# damaged records of §10b, messages
# that could not be delivered, the refusals of §11 (before any session was looked at; a session of
# another identity or face), the tasks and upstream pool of §12, and the shared log's fence,
# takeovers and forwards of §13.
EXTRA_METRICS = {
    "mcp_resume_log_max_bytes": ("gauge", ()),
    "mcp_resume_log_disk_bytes": ("gauge", ()),
    "mcp_resume_store_errors_total": ("counter", ()),
    "mcp_resume_store_damage_total": ("counter", ()),
    "mcp_resume_dropped_total": ("counter", ("reason",)),
    "mcp_resume_requests_rejected_total": ("counter", ("reason",)),
    "mcp_resume_auth_rejected_total": ("counter", ("facade",)),
    "mcp_resume_tasks_total": ("counter", ("status",)),
    "mcp_resume_upstream_pool_sessions": ("gauge", ()),
    # §13, several replicas on Redis: writes refused by the fence, sessions taken over from a
    # replica whose lease lapsed, requests forwarded to the owner (or refused as forwards).
    "mcp_resume_fenced_total": ("counter", ()),
    "mcp_resume_takeovers_total": ("counter", ()),
    "mcp_resume_forwards_total": ("counter", ("outcome",)),
    # Round trips to Redis by op, and whether the doorbell's pub/sub connection is up.
    "mcp_resume_redis_seconds": ("histogram", ("op",)),
    "mcp_resume_redis_doorbell_up": ("gauge", ()),
}
ALL_METRICS = {**METRICS, **EXTRA_METRICS}

# Known label values (design.md §4, §7, and §10 for `store_error`); every one should be exported
# from the start at 0, so rate() and the alerts see a series before the first event.
REFUSAL_REASONS = (
    "malformed_cursor",
    "foreign_session",
    "unknown_session",
    "cursor_trimmed",
    "cursor_ahead",
    "unknown_epoch",
)
ENDED_REASONS = ("client_delete", "idle_timeout", "upstream_lost", "shutdown", "evicted", "store_error")
FACADES = ("legacy", "streamable")
# src/metrics.rs DROPPED_REASONS and REJECT_REASONS, src/modern/tasks.rs TASK_STATUSES.
DROPPED_REASONS = ("oversized_event", "bad_event", "late_response", "non_message_event", "reader_trimmed",
                   "slow_reader")
REJECT_REASONS = ("origin_not_allowed", "host_not_allowed", "identity_required", "unsupported_media_type")
TASK_STATUSES = ("created", "completed", "failed", "cancelled", "expired")
# src/metrics.rs FORWARD_OUTCOMES.
FORWARD_OUTCOMES = ("ok", "error", "timeout", "refused")
# src/metrics.rs REDIS_OPS.
REDIS_OPS = ("append", "read", "write", "lease")

# Metrics that queries may name besides the proxy's own.
PROMETHEUS_METRICS = {"up"}
KUBE_STATE_METRICS = {
    "kube_deployment_spec_replicas",
    "kube_deployment_status_replicas_ready",
    "kube_statefulset_replicas",
    "kube_statefulset_status_replicas_ready",
    # McpResumeStoreErrors: a proxy that exits 74 (storage failed) usually dies before a scrape
    # sees its mcp_resume_store_errors_total move; its restart is seen here.
    "kube_pod_container_status_restarts_total",
    "kube_pod_container_status_last_terminated_exitcode",
}

# The proxy's config: section -> keys, exactly, in the order of the proxy's config structs
# (src/config.rs `Config` and the section structs it names; contract.py compares them). A table
# inside a section (`[log.redis]`, the `redis` field of `[log]`'s struct) is its own section,
# named with a dot, right after its parent.
CONFIG_KEYS = {
    "listen": [
        "addr", "max_connections", "max_connections_per_identity", "body_timeout_secs", "max_body_bytes_in_flight", "allowed_origins",
        "allowed_hosts",
    ],
    "admin": ["addr"],
    "upstream": [
        "sse_url", "post_timeout_secs", "connect_timeout_secs", "max_event_bytes", "request_timeout_secs",
        "ca_file", "allowed_endpoint_origins",
    ],
    "legacy": ["sse_path", "message_path"],
    "streamable": ["path", "allowed_origins"],
    "log": [
        "dir", "durability", "max_events_per_session", "max_bytes_per_session", "max_total_bytes",
        "store_error_exit_secs", "backend",
    ],
    "log.redis": ["url", "key_prefix", "url_file"],
    "sessions": [
        "idle_ttl_secs", "retain_ended_secs", "max_sessions", "keepalive_secs", "max_per_identity", "unused_ttl_secs",
    ],
    "shutdown": ["grace_secs"],
    "auth": [
        "mode", "identity_headers", "require_identity", "jwks_file", "issuer", "audience", "leeway_secs",
        "algorithms", "resource_metadata_url", "key_file",
    ],
    "tls": ["cert_file", "key_file", "client_ca_file", "reload_secs"],
    "modern": ["pool_max_sessions", "pool_idle_secs", "pool_wait_secs", "cache_ttl_ms", "input_ttl_secs",
               "max_per_identity", "listen_max_secs", "discover"],
    "tasks": ["mode", "after_ms", "ttl_secs", "poll_interval_ms"],
    "cluster": ["replica_id", "lease_ms", "listen", "advertise_addr", "secret_file", "forward_timeout_ms"],
}
# The default of `cluster.replica_id`: the host name (`HOSTNAME`, else /etc/hostname), known only
# where the proxy runs.
HOST_NAME = "<host name>"
# Sections the chart writes only with log.backend = "redis" (the proxy's defaults otherwise).
REDIS_SECTIONS = ("log.redis", "cluster")
# The proxy's defaults. None: an optional key without a default (a file path), absent from the
# TOML unless set; its value is a string. `tls.reload_secs` is optional in the proxy too, and
# absent means 10 (tls::DEFAULT_RELOAD_SECS); the chart always writes it.
CONFIG_DEFAULTS = {
    "listen": {
        "addr": "127.0.0.1:8080",
        "max_connections": 10000,
        "max_connections_per_identity": 0,
        "body_timeout_secs": 30,
        "max_body_bytes_in_flight": 67108864,
        "allowed_origins": [],
        "allowed_hosts": [],
    },
    "admin": {"addr": "127.0.0.1:9090"},
    "upstream": {
        "sse_url": "http://127.0.0.1:8000/sse",
        "post_timeout_secs": 30,
        "connect_timeout_secs": 10,
        "max_event_bytes": 4194304,
        "request_timeout_secs": 0,
        "ca_file": None,
        "allowed_endpoint_origins": [],
    },
    "legacy": {"sse_path": "/sse", "message_path": "/messages"},
    "streamable": {"path": "/mcp", "allowed_origins": []},
    "log": {
        "dir": "./data",
        "durability": "fsync",
        "max_events_per_session": 10000,
        "max_bytes_per_session": 67108864,
        "max_total_bytes": 1073741824,
        "store_error_exit_secs": 60,
        "backend": "local",
    },
    "log.redis": {"url": "", "key_prefix": "mcp-resume", "url_file": None},
    "sessions": {
        "idle_ttl_secs": 300,
        "retain_ended_secs": 600,
        "max_sessions": 10000,
        "keepalive_secs": 15,
        "max_per_identity": 1000,
        "unused_ttl_secs": 15,
    },
    "shutdown": {"grace_secs": 10},
    "auth": {
        "mode": "opaque",
        "identity_headers": ["authorization"],
        "require_identity": False,
        "jwks_file": None,
        "issuer": "",
        "audience": [],
        "leeway_secs": 60,
        "algorithms": ["RS256", "ES256", "EdDSA"],
        "resource_metadata_url": "",
        "key_file": None,
    },
    "tls": {"cert_file": None, "key_file": None, "client_ca_file": None, "reload_secs": 10},
    "modern": {
        "pool_max_sessions": 64,
        "pool_idle_secs": 60,
        "pool_wait_secs": 10,
        "cache_ttl_ms": 0,
        "input_ttl_secs": 300,
        "max_per_identity": 8,
        "listen_max_secs": 3600,
        "discover": "resumable",
    },
    "tasks": {"mode": "after", "after_ms": 1000, "ttl_secs": 3600, "poll_interval_ms": 1000},
    "cluster": {
        "replica_id": HOST_NAME,
        "lease_ms": 10000,
        "listen": "",
        "advertise_addr": "",
        "secret_file": None,
        "forward_timeout_ms": 5000,
    },
}
# Keys the chart sets itself (not values under proxy.config): the listeners' addresses from the
# ports, the log on the data volume, and the TLS files from the mounted Secrets. upstream.sse_url
# is derived too, unless proxy.config.upstream.sse_url is set. So are those of several replicas
# on Redis: the URL file from proxy.redis.urlSecret, the key files from proxy.cluster.keysSecret,
# the internal listener from proxy.cluster.forwarding and internalPort, and the replica's name and
# advertised address, which differ per pod and so are left to the proxy's defaults (the pod's
# host name; $POD_IP with the internal port; chart README, "Several replicas on Redis").
CONFIG_DERIVED = {
    ("listen", "addr"),
    ("admin", "addr"),
    ("log", "dir"),
    ("upstream", "ca_file"),
    ("tls", "cert_file"),
    ("tls", "key_file"),
    ("tls", "client_ca_file"),
    ("auth", "jwks_file"),
    ("auth", "key_file"),
    ("log.redis", "url_file"),
    ("cluster", "replica_id"),
    ("cluster", "listen"),
    ("cluster", "advertise_addr"),
    ("cluster", "secret_file"),
}

CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


def section(table: dict, name: str) -> dict:
    """The table of section NAME (dotted for a nested one, e.g. "log.redis") in a parsed TOML
    document or proxy.config, without its nested sections' tables; {} when absent."""
    for part in name.split("."):
        table = table.get(part) if isinstance(table, dict) else None
        if table is None:
            return {}
    nested = {n.split(".")[-1] for n in CONFIG_KEYS if n.startswith(name + ".")}
    return {k: v for k, v in table.items() if k not in nested}


class Checks:
    """Collects named assertions; `done()` prints a summary and gives the exit code."""

    def __init__(self, title: str):
        self.title = title
        self.failures: list[str] = []
        self.count = 0

    def check(self, cond: object, what: str) -> bool:
        self.count += 1
        if not cond:
            self.failures.append(what)
            print(f"  not ok: {what}")
        return bool(cond)

    def eq(self, got: object, want: object, what: str) -> bool:
        return self.check(got == want, f"{what}: got {got!r}, want {want!r}")

    def done(self) -> int:
        print(f"{self.title}: {self.count - len(self.failures)}/{self.count} assertions hold")
        return 1 if self.failures else 0


def load_docs(path: str | os.PathLike) -> list[dict]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def chart_values(*files: str) -> dict:
    with open(CHART / "values.yaml") as f:
        values = yaml.safe_load(f)
    for path in files:
        with open(path) as f:
            values = deep_merge(values, yaml.safe_load(f) or {})
    return values


def design_metrics() -> dict[str, tuple[str, tuple[str, ...]]] | None:
    """The metric table of design.md §7, or None when shared/ is not beside the repository."""
    candidate = ROOT.parent / "shared" / "design.md"
    if not candidate.is_file():
        return None
    text = candidate.read_text()
    section = text.split("## 7.", 1)[1].split("\n## ", 1)[0]
    out = {}
    for m in re.finditer(r"^\| `(mcp_resume_[a-z_]+)` \| (\w+) \| ([^|]*)\|", section, re.M):
        labels = tuple(re.findall(r"^`([a-z_]+)`", m.group(3).strip()))
        out[m.group(1)] = (m.group(2), labels)
    return out


_PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "offset", "bool", "inf", "nan", "atan2", "start", "end",
}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (a lexical scan: strings, label matchers, ranges,
    offsets, grouping clauses and function calls removed; what is left as an identifier is a metric)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\boffset\s+-?[0-9][0-9a-z]*", " ", s)  # `offset 10m`: a duration, not a metric
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = m.group(0)
        rest = s[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in _PROMQL_KEYWORDS:
            continue
        if re.fullmatch(r"[0-9.eE+-]+", word):
            continue
        names.add(word)
    return names


def base_metric(name: str) -> str:
    """Histogram series name -> family name."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in ALL_METRICS:
            return name[: -len(suffix)]
    return name


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)
