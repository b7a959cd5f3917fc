"""Assertions over one `helm template` rendering of the chart.

    python assert_render.py RENDERED.yaml --release NAME --namespace NS [--values FILE ...]

The values files are the ones given to `helm template`; the expected rendering is derived from
them merged over the chart's values.yaml, so every scenario checks its own settings.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib

from common import (
    CHART,
    CONFIG_DEFAULTS,
    CONFIG_DERIVED,
    CONFIG_KEYS,
    CRD_KINDS,
    HOST_NAME,
    REDIS_SECTIONS,
    ROOT,
    Checks,
    chart_values,
    load_docs,
)
from common import section as table_of

SECRETS_DIR = "/var/run/secrets/mcp-resume-proxy"

RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
}


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def one(c: Checks, kinds: dict, kind: str) -> dict | None:
    items = kinds.get(kind, [])
    c.eq(len(items), 1, f"exactly one {kind}")
    return items[0] if items else None


def port_number(container: dict, port: object) -> object:
    """A probe or Service port (name or number) resolved against the container's ports."""
    for p in container.get("ports", []):
        if p.get("name") == port or p.get("containerPort") == port:
            return p["containerPort"]
    return None


def matches(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def derived_config(v: dict) -> dict[tuple[str, str], object]:
    """The keys the chart sets itself, as the values given should make it set them (None: the key
    is left out of the file)."""
    pc = v["proxy"]["config"]
    return {
        ("listen", "addr"): f"0.0.0.0:{v['proxy']['port']}",
        ("admin", "addr"): f"0.0.0.0:{v['proxy']['adminPort']}",
        ("upstream", "sse_url"): pc["upstream"]["sse_url"]
        or f"http://127.0.0.1:{v['mcpServer']['port']}{v['mcpServer']['ssePath']}",
        ("log", "dir"): "/data",
        ("upstream", "ca_file"): f"{SECRETS_DIR}/upstream-ca/ca.crt" if upstream_ca(v) else None,
        ("tls", "cert_file"): f"{SECRETS_DIR}/tls/tls.crt" if v["tls"]["secretName"] else None,
        ("tls", "key_file"): f"{SECRETS_DIR}/tls/tls.key" if v["tls"]["secretName"] else None,
        ("tls", "client_ca_file"): f"{SECRETS_DIR}/client-ca/ca.crt" if v["tls"]["clientCaSecretName"] else None,
        ("auth", "jwks_file"): f"{SECRETS_DIR}/jwks/jwks.json" if jwks(v) else None,
        ("auth", "key_file"): f"{SECRETS_DIR}/keys/identity.key" if v["proxy"]["cluster"]["keysSecret"]["name"] else None,
        ("log.redis", "url_file"): f"{SECRETS_DIR}/redis/url" if redis_on(v) and redis_url_secret(v) else None,
        ("cluster", "replica_id"): None,
        ("cluster", "listen"): f"0.0.0.0:{v['proxy']['cluster']['internalPort']}" if forwarding(v) else None,
        ("cluster", "advertise_addr"): None,
        ("cluster", "secret_file"): f"{SECRETS_DIR}/keys/forwarding.key" if forwarding(v) else None,
    }


def redis_url_secret(v: dict) -> tuple[str, str, str] | None:
    """(kind, name, key) of the Redis URL's Secret (proxy.redis.urlSecret), or None."""
    u = v["proxy"]["redis"]["urlSecret"]
    return ("secret", u["name"], u["key"]) if u["name"] else None


def forwarding(v: dict) -> bool:
    """The internal listener is on (proxy.cluster.forwarding)."""
    return bool(v["proxy"]["cluster"]["forwarding"])


def jwks(v: dict) -> tuple[str, str, str] | None:
    """(kind, name, key) of the JWKS's source (auth.mode = "jwt"), or None."""
    j = v["jwks"]
    if v["proxy"]["config"]["auth"]["mode"] != "jwt":
        return None
    if j["secretName"]:
        return ("secret", j["secretName"], j["key"])
    if j["configMapName"]:
        return ("configMap", j["configMapName"], j["key"])
    return None


def upstream_ca(v: dict) -> tuple[str, str, str] | None:
    """(kind, name, key) of the upstream CA bundle's source, or None."""
    u = v["tls"]["upstreamCa"]
    if u["secretName"]:
        return ("secret", u["secretName"], u["key"])
    if u["configMapName"]:
        return ("configMap", u["configMapName"], u["key"])
    return None


def check_files(c: Checks, cfg: dict, v: dict, proxy: dict, server: dict, volumes: dict) -> None:
    """Each file the config names is in a read-only volume of the proxy container, projected from
    the Secret or ConfigMap key the values name; nothing of it reaches the MCP server container."""
    tls = v["tls"]
    keys = v["proxy"]["cluster"]["keysSecret"]
    sources = {
        ("tls", "cert_file"): ("secret", tls["secretName"], "tls.crt"),
        ("tls", "key_file"): ("secret", tls["secretName"], "tls.key"),
        ("tls", "client_ca_file"): ("secret", tls["clientCaSecretName"], tls["clientCaKey"]),
        ("upstream", "ca_file"): upstream_ca(v),
        ("auth", "jwks_file"): jwks(v),
        ("log.redis", "url_file"): redis_url_secret(v),
        ("auth", "key_file"): ("secret", keys["name"], keys["identityKey"]),
        ("cluster", "secret_file"): ("secret", keys["name"], keys["forwardingKey"]),
    }
    # Files holding secrets: the TLS key, the Redis URL (maybe with a password), the shared keys.
    secret_files = {("tls", "key_file"), ("log.redis", "url_file"), ("auth", "key_file"), ("cluster", "secret_file")}
    mounts = proxy.get("volumeMounts", [])
    used = set()
    for (section, key), source in sources.items():
        path = table_of(cfg, section).get(key)
        if path is None:
            continue
        what = f"{section}.{key} ({path})"
        directory, _, filename = path.rpartition("/")
        mount = next((m for m in mounts if m["mountPath"] == directory), None)
        if not c.check(mount is not None, f"{what}: a volume is mounted at its directory"):
            continue
        c.check(mount.get("readOnly") is True, f"{what}: mounted read-only")
        c.check("subPath" not in mount and "subPathExpr" not in mount,
                f"{what}: whole-volume mount (a subPath mount is never updated, so rotations would not reach it)")
        vol = volumes.get(mount["name"], {})
        used.add(mount["name"])
        kind, name, item = source or ("?", "?", "?")
        src = vol.get(kind, {})
        c.eq(src.get("secretName" if kind == "secret" else "name"), name, f"{what}: volume {mount['name']} is {kind} {name}")
        c.eq([i for i in src.get("items", []) if i.get("path") == filename], [{"key": item, "path": filename}],
             f"{what}: the file is key {item} of {kind} {name}")
        if (section, key) in secret_files:
            mode = src.get("defaultMode")
            c.check(mode is not None and mode & 0o7 == 0, f"{what}: the secret is not world-readable (mode {mode!r})")
            # The proxy refuses key files writable by the group or open to others (0440/0640 pass).
            c.check(mode is not None and mode & 0o27 == 0, f"{what}: mode {mode!r} passes the proxy's key file check")
            c.check(v["podSecurityContext"].get("fsGroup") is not None and mode is not None and mode & 0o40,
                    f"{what}: readable through the pod's fsGroup")
    c.eq(sorted(n for n in (m["name"] for m in mounts) if n not in ("config", "data")), sorted(used),
         "the proxy mounts no other volume than config, data and the files its config names")
    server_mounts = {m["name"] for m in server.get("volumeMounts", [])}
    c.check(not (server_mounts & used), "the MCP server container mounts none of the Secret volumes")
    c.eq(sorted(n for n in volumes if volumes[n].get("secret") and n != "config"),
         sorted(n for n in used if volumes[n].get("secret")), "no Secret volume without a use")


def redis_on(v: dict) -> bool:
    return v["proxy"]["config"]["log"]["backend"] == "redis"


def config_text(c: Checks, kinds: dict, vol: dict, v: dict) -> str | None:
    """config.toml from the ConfigMap the config volume names (with any backend: the file holds no
    secret, the Redis URL with a password comes from proxy.redis.urlSecret)."""
    c.check("Secret" not in kinds, "the chart renders no Secret (secrets come from the user's Secrets)")
    url = v["proxy"]["config"]["log"]["redis"]["url"]
    c.check("@" not in url, f"the inline Redis URL carries no credentials ({url!r})")
    name = vol.get("configMap", {}).get("name")
    found = {cm["metadata"]["name"]: cm for cm in kinds.get("ConfigMap", [])}.get(name)
    if not c.check(found is not None, f"config volume refers to a rendered ConfigMap ({name})"):
        return None
    return found["data"].get("config.toml", "")


def check_config(c: Checks, text: str, v: dict) -> dict:
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        c.check(False, f"config.toml parses as TOML: {e}")
        return {}
    derived = derived_config(v)
    # [log.redis] and [cluster] only with log.backend = "redis" (else the proxy's defaults hold).
    sections = [s for s in CONFIG_KEYS if redis_on(v) or s not in REDIS_SECTIONS]
    c.eq(list(cfg), [s for s in sections if "." not in s], "config.toml sections (exactly, in order)")
    c.eq(list(cfg.get("log", {}))[-1:], ["redis"] if redis_on(v) else list(cfg.get("log", {}))[-1:],
         "[log.redis] follows the [log] keys")
    for sec in sections:
        keys = CONFIG_KEYS[sec]
        # Optional keys (no default, e.g. a file path) are written only when the chart sets them;
        # keys the chart leaves to the proxy (cluster.replica_id) are not written at all.
        want = [k for k in keys
                if (derived.get((sec, k)) is not None if (sec, k) in CONFIG_DERIVED else CONFIG_DEFAULTS[sec][k] is not None)]
        table = table_of(cfg, sec)
        c.eq(list(table), want, f"config.toml [{sec}] keys (exactly)")
        for key in want:
            default = CONFIG_DEFAULTS[sec][key]
            want_type = str if default is None or default == HOST_NAME else type(default)
            got = table.get(key)
            c.check(type(got) is want_type, f"{sec}.{key} is a {want_type.__name__} (got {got!r})")
            if isinstance(default, list):
                c.check(all(type(x) is str for x in got or []), f"{sec}.{key} is a list of strings (got {got!r})")
    pc = v["proxy"]["config"]
    for (sec, key), want in derived.items():
        c.eq(table_of(cfg, sec).get(key), want, f"{sec}.{key} is set by the chart")
    for sec, keys in CONFIG_KEYS.items():
        in_values = [k for k in keys if (sec, k) not in CONFIG_DERIVED]
        c.eq(sorted(table_of(pc, sec)), sorted(in_values), f"values.yaml proxy.config.{sec} has every settable key")
    for sec in sections:
        for key in CONFIG_KEYS[sec]:
            if (sec, key) not in derived:
                c.eq(table_of(cfg, sec).get(key), table_of(pc, sec)[key], f"{sec}.{key} comes from proxy.config")
    return cfg


def check_security(c: Checks, pod: dict, container: dict) -> None:
    psc = pod.get("securityContext", {})
    sc = container.get("securityContext", {})
    name = container["name"]
    for k, want in RESTRICTED_CONTAINER.items():
        c.eq(sc.get(k), want, f"{name}: securityContext.{k}")
    c.eq(sc.get("capabilities", {}).get("drop"), ["ALL"], f"{name}: drops all capabilities")
    c.check(not sc.get("capabilities", {}).get("add"), f"{name}: adds no capabilities")
    c.check(sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, f"{name}: runAsNonRoot")
    uid = sc.get("runAsUser", psc.get("runAsUser"))
    c.check(isinstance(uid, int) and uid > 0, f"{name}: runs as a non-zero uid (got {uid!r})")
    seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {}))
    c.eq(seccomp.get("type"), "RuntimeDefault", f"{name}: seccomp profile")
    c.check(not sc.get("privileged"), f"{name}: not privileged")
    c.check("requests" in container.get("resources", {}) and "limits" in container.get("resources", {}),
            f"{name}: has resource requests and limits")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("rendered")
    ap.add_argument("--release", required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--values", action="append", default=[])
    args = ap.parse_args()

    v = chart_values(*args.values)
    docs = load_docs(args.rendered)
    kinds = by_kind(docs)
    c = Checks(f"render assertions ({', '.join(args.values) or 'default values'})")

    persistent = v["persistence"]["enabled"]
    workload_kind = "StatefulSet" if persistent else "Deployment"
    other_kind = "Deployment" if persistent else "StatefulSet"
    c.check(other_kind not in kinds, f"no {other_kind} rendered")
    wl = one(c, kinds, workload_kind)
    if wl is None:
        return c.done()
    fullname = wl["metadata"]["name"]
    pod_meta = wl["spec"]["template"]["metadata"]
    pod = wl["spec"]["template"]["spec"]
    pod_labels = pod_meta["labels"]
    c.check(matches(wl["spec"]["selector"]["matchLabels"], pod_labels), "workload selector matches its pod labels")
    c.eq(wl["spec"]["replicas"], v["replicaCount"], "replicas")

    containers = {ct["name"]: ct for ct in pod["containers"]}
    c.eq(sorted(containers), ["mcp-server", "proxy"], "pod runs the MCP server and the proxy sidecar")
    proxy = containers.get("proxy")
    server = containers.get("mcp-server")
    if not proxy or not server:
        return c.done()

    # Images.
    img = v["mcpServer"]["image"]
    c.eq(server["image"], f"{img['repository']}:{img['tag']}", "MCP server image")
    pimg = v["proxy"]["image"]
    with open(CHART / "Chart.yaml") as f:
        app_version = next(line.split(":", 1)[1].strip().strip('"') for line in f if line.startswith("appVersion:"))
    c.eq(proxy["image"], f"{pimg['repository']}:{pimg['tag'] or app_version}", "proxy image (tag defaults to appVersion)")

    # Ports and probes.
    c.eq(port_number(server, "mcp"), v["mcpServer"]["port"], "MCP server container port")
    tls_on = bool(v["tls"]["secretName"])
    client_port = "https" if tls_on else "http"
    c.eq(port_number(proxy, client_port), v["proxy"]["port"], f"proxy client port (named {client_port})")
    c.eq(port_number(proxy, "admin"), v["proxy"]["adminPort"], "proxy admin port")
    c.eq(sorted(p["name"] for p in proxy.get("ports", [])), sorted([client_port, "admin"] + (["cluster"] if forwarding(v) else [])),
         "proxy port names (the internal port with forwarding)")
    if forwarding(v):
        c.eq(port_number(proxy, "cluster"), v["proxy"]["cluster"]["internalPort"], "proxy internal port (cluster.listen)")
    # cluster.listen = 0.0.0.0:<port> is advertised as $POD_IP:<port>: POD_IP from the downward API.
    env = {e["name"]: e for e in proxy.get("env", [])}
    if forwarding(v):
        c.eq(env.get("POD_IP", {}).get("valueFrom"), {"fieldRef": {"fieldPath": "status.podIP"}},
             "proxy env POD_IP from the downward API (status.podIP)")
    else:
        c.check("POD_IP" not in env, "no POD_IP without forwarding")
    c.eq([e for e in proxy.get("env", []) if e["name"] != "POD_IP"], v["proxy"]["env"], "proxy env from proxy.env")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz")):
        get = proxy.get(probe, {}).get("httpGet", {})
        c.eq(get.get("path"), path, f"proxy {probe} path")
        c.eq(port_number(proxy, get.get("port")), v["proxy"]["adminPort"], f"proxy {probe} hits the admin port")
        c.eq(get.get("scheme", "HTTP"), "HTTP", f"proxy {probe} is plain HTTP (the admin port never speaks TLS)")

    # Config file: mounted where the args point, and complete.
    c.eq(proxy.get("args", [])[:3], ["run", "--config", "/etc/mcp-resume-proxy/config.toml"], "proxy args")
    mounts = {m["name"]: m for m in proxy.get("volumeMounts", [])}
    c.eq(mounts.get("config", {}).get("mountPath"), "/etc/mcp-resume-proxy", "config volume mount")
    c.check(mounts.get("config", {}).get("readOnly") is True, "config volume is mounted read-only")
    volumes = {vol["name"]: vol for vol in pod.get("volumes", [])}
    cfg: dict = {}
    text = config_text(c, kinds, volumes.get("config", {}), v)
    if text is not None:
        cfg = check_config(c, text, v)
        c.check(pod_meta.get("annotations", {}).get("checksum/config"), "pod template carries checksum/config")
        check_files(c, cfg, v, proxy, server, volumes)

    # Data volume: writable, where log.dir points; emptyDir or a claim template.
    c.eq(mounts.get("data", {}).get("mountPath"), cfg.get("log", {}).get("dir", "/data"), "data volume is mounted at log.dir")
    c.check(not mounts.get("data", {}).get("readOnly"), "data volume is writable")
    if persistent:
        c.check("data" not in volumes, "no emptyDir data volume with persistence")
        claims = {t["metadata"]["name"]: t for t in wl["spec"].get("volumeClaimTemplates", [])}
        claim = claims.get("data", {})
        c.eq(claim.get("spec", {}).get("resources", {}).get("requests", {}).get("storage"),
             v["persistence"]["size"], "volumeClaimTemplate data requests persistence.size")
        sc = v["persistence"]["storageClass"]
        c.eq(claim.get("spec", {}).get("storageClassName"), sc or None, "claim storage class")
        services = {s["metadata"]["name"]: s for s in kinds.get("Service", [])}
        gov = services.get(wl["spec"].get("serviceName"))
        c.check(gov is not None and gov["spec"].get("clusterIP") == "None",
                "StatefulSet serviceName is a rendered headless Service")
    else:
        c.check("emptyDir" in volumes.get("data", {}), "data volume is an emptyDir")
        c.check("volumeClaimTemplates" not in wl["spec"], "no claim templates without persistence")

    # Security.
    psc = pod.get("securityContext", {})
    c.eq(psc.get("runAsNonRoot"), True, "pod runAsNonRoot")
    c.eq(psc.get("seccompProfile", {}).get("type"), "RuntimeDefault", "pod seccomp RuntimeDefault")
    c.eq(pod.get("automountServiceAccountToken"), False, "no service account token mounted")
    for ct in (server, proxy):
        check_security(c, pod, ct)
    c.check(not pod.get("hostNetwork") and not pod.get("hostPID"), "no host namespaces")

    # Drain: the kubelet must wait longer than the proxy drains.
    grace = cfg.get("shutdown", {}).get("grace_secs", 0)
    tgps = pod.get("terminationGracePeriodSeconds", 30)
    c.check(tgps > grace, f"terminationGracePeriodSeconds ({tgps}) > shutdown.grace_secs ({grace})")

    # Services: clients reach the proxy only.
    services = kinds.get("Service", [])
    main = next((s for s in services if s["metadata"]["name"] == fullname), None)
    if c.check(main is not None, "client Service named like the workload"):
        c.check(matches(main["spec"]["selector"], pod_labels), "client Service selects the pods")
        ports = main["spec"]["ports"]
        c.eq([port_number(proxy, p["targetPort"]) for p in ports], [v["proxy"]["port"]],
             "client Service targets only the proxy's client port")
        c.eq(ports[0]["port"], v["service"]["port"], "client Service port")
        c.eq(ports[0].get("name"), client_port, "client Service port name")
        c.eq(ports[0].get("appProtocol"), "https" if tls_on else None, "client Service appProtocol (https with TLS)")
        if v["service"]["sessionAffinity"]["enabled"]:
            c.eq(main["spec"].get("sessionAffinity"), "ClientIP", "session affinity by client IP")
            c.eq(main["spec"].get("sessionAffinityConfig", {}).get("clientIP", {}).get("timeoutSeconds"),
                 v["service"]["sessionAffinity"]["timeoutSeconds"], "session affinity timeout")
        else:
            c.check("sessionAffinity" not in main["spec"], "no session affinity unless enabled")
    mcp_port = v["mcpServer"]["port"]
    for s in services:
        for p in s["spec"]["ports"]:
            c.check(p.get("targetPort") not in ("mcp", mcp_port), f"Service {s['metadata']['name']} does not expose the MCP server")
    admin = next((s for s in services if s["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "admin"), None)
    if c.check(admin is not None, "admin (headless) Service rendered"):
        c.check(matches(admin["spec"]["selector"], pod_labels), "admin Service selects the pods")
        c.eq([port_number(proxy, p["targetPort"]) for p in admin["spec"]["ports"]], [v["proxy"]["adminPort"]],
             "admin Service targets the admin port")

    # PodDisruptionBudget.
    if v["podDisruptionBudget"]["enabled"]:
        pdb = one(c, kinds, "PodDisruptionBudget")
        if pdb:
            c.check(matches(pdb["spec"]["selector"]["matchLabels"], pod_labels), "PDB selects the pods")
            c.check(("minAvailable" in pdb["spec"]) != ("maxUnavailable" in pdb["spec"]),
                    "PDB sets exactly one of minAvailable / maxUnavailable")

    # NetworkPolicy.
    if v["networkPolicy"]["enabled"]:
        np = one(c, kinds, "NetworkPolicy")
        if np:
            c.check(matches(np["spec"]["podSelector"]["matchLabels"], pod_labels), "NetworkPolicy selects the pods")
            c.eq(np["spec"]["policyTypes"], ["Ingress"], "NetworkPolicy policy types")
            allowed = sorted(port_number(proxy, p["port"]) for rule in np["spec"]["ingress"] for p in rule["ports"])
            internal = [v["proxy"]["cluster"]["internalPort"]] if forwarding(v) else []
            c.eq(allowed, sorted([v["proxy"]["port"], v["proxy"]["adminPort"], *internal]),
                 "NetworkPolicy admits only the proxy's ports (not the MCP server's)")
            cluster_rules = [r for r in np["spec"]["ingress"] if any(p["port"] == "cluster" for p in r["ports"])]
            if forwarding(v):
                c.eq(len(cluster_rules), 1, "one NetworkPolicy rule for the internal port")
                rule = cluster_rules[0] if cluster_rules else {}
                c.eq(rule.get("ports"), [{"port": "cluster", "protocol": "TCP"}], "the internal port's rule names only it")
                peers = rule.get("from", [])
                c.eq([sorted(p) for p in peers], [["podSelector"]], "the internal port admits one podSelector peer (no namespaceSelector: this namespace)")
                c.eq(peers[0]["podSelector"].get("matchLabels") if peers else None, wl["spec"]["selector"]["matchLabels"],
                     "the internal port admits exactly this release's pods (the workload's selector labels)")
            else:
                c.eq(cluster_rules, [], "no internal port rule without forwarding")
            metrics_rule = next((r for r in np["spec"]["ingress"] if r["ports"][0]["port"] == "admin"), {})
            c.eq(metrics_rule.get("from", []), v["networkPolicy"]["metricsFrom"], "admin port peers")
    else:
        c.check("NetworkPolicy" not in kinds, "no NetworkPolicy unless enabled")

    # Prometheus Operator resources (CRDs: no bundled schema, so checked structurally here).
    if v["metrics"]["serviceMonitor"]["enabled"]:
        sm = one(c, kinds, "ServiceMonitor")
        if sm:
            c.eq(sm["apiVersion"], "monitoring.coreos.com/v1", "ServiceMonitor apiVersion")
            labels = sm["metadata"].get("labels", {})
            for k, val in v["metrics"]["serviceMonitor"]["labels"].items():
                c.eq(labels.get(k), val, f"ServiceMonitor label {k}")
            sel = sm["spec"]["selector"]["matchLabels"]
            hits = [s["metadata"]["name"] for s in services if matches(sel, s["metadata"].get("labels", {}))]
            c.eq(hits, [admin["metadata"]["name"]] if admin else [], "ServiceMonitor selects only the admin Service")
            c.eq(sm["spec"]["namespaceSelector"], {"matchNames": [args.namespace]}, "ServiceMonitor namespace")
            ep = sm["spec"]["endpoints"]
            c.eq(len(ep), 1, "one scrape endpoint")
            if ep:
                c.eq(ep[0].get("port"), "admin", "scrapes the admin port by name")
                if admin:
                    c.check(ep[0].get("port") in [p["name"] for p in admin["spec"]["ports"]],
                            "scrape port is a port of the admin Service")
                c.eq(ep[0].get("path"), "/metrics", "scrape path")
                c.eq(ep[0].get("scheme", "http"), "http", "scrapes over plain HTTP (the admin port never speaks TLS)")
                relabel = {r.get("targetLabel"): r.get("replacement") for r in ep[0].get("relabelings", [])}
                c.eq(relabel.get("job"), fullname, "scraped series get job=<fullname>, as the alerts select")
                allowed = {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings", "scheme"}
                c.check(set(ep[0]) <= allowed, f"endpoint fields are ServiceMonitor fields: {sorted(ep[0])}")
    else:
        c.check("ServiceMonitor" not in kinds, "no ServiceMonitor unless enabled")

    if v["prometheusRule"]["enabled"]:
        rule = one(c, kinds, "PrometheusRule")
        if rule:
            c.eq(rule["apiVersion"], "monitoring.coreos.com/v1", "PrometheusRule apiVersion")
            c.eq(sorted(rule["spec"]), ["groups"], "PrometheusRule spec has only groups")
            readme = (CHART / "README.md").read_text().lower()
            for group in rule["spec"]["groups"]:
                c.check(set(group) <= {"name", "interval", "rules"}, f"group {group.get('name')} fields")
                for r in group["rules"]:
                    name = r.get("alert", "?")
                    c.check(set(r) <= {"alert", "expr", "for", "labels", "annotations"}, f"{name}: rule fields")
                    c.check(r.get("expr"), f"{name}: has expr")
                    c.check(r.get("labels", {}).get("severity") in ("warning", "critical", "info"), f"{name}: severity")
                    ann = r.get("annotations", {})
                    c.check(ann.get("summary") and ann.get("description"), f"{name}: summary and description")
                    anchor = ann.get("runbook_url", "").rpartition("#")[2]
                    c.check(anchor == name.lower() and f"### {name.lower()}" in readme,
                            f"{name}: runbook_url points at its README section")
                    c.check(ann.get("runbook_url", "").startswith(v["prometheusRule"]["runbookBaseUrl"]),
                            f"{name}: runbook_url uses prometheusRule.runbookBaseUrl")
    else:
        c.check("PrometheusRule" not in kinds, "no PrometheusRule unless enabled")

    # Dashboard ConfigMap: the same JSON as deploy/grafana, with the Grafana sidecar label.
    dash_cms = [cm for cm in kinds.get("ConfigMap", []) if cm["metadata"]["name"].endswith("-dashboard")]
    if v["dashboard"]["enabled"]:
        c.eq(len(dash_cms), 1, "one dashboard ConfigMap")
        if dash_cms:
            dcm = dash_cms[0]
            c.eq(dcm["metadata"]["labels"].get("grafana_dashboard"), "1", "dashboard ConfigMap has the Grafana sidecar label")
            body = dcm["data"].get("mcp-resume-proxy.json", "")
            with open(ROOT / "deploy" / "grafana" / "mcp-resume-proxy.json") as f:
                c.check(json.loads(body) == json.load(f), "dashboard ConfigMap holds deploy/grafana/mcp-resume-proxy.json")
    else:
        c.eq(dash_cms, [], "no dashboard ConfigMap unless enabled")

    # Every core resource carries the standard labels; CRD kinds are the only non-core ones.
    for d in docs:
        labels = d["metadata"].get("labels", {})
        c.check(labels.get("app.kubernetes.io/instance") == args.release and "helm.sh/chart" in labels,
                f"{d['kind']}/{d['metadata']['name']} has the standard labels")
    c.check({d["kind"] for d in docs} - CRD_KINDS <= {
        "ConfigMap", "Service", "ServiceAccount", "Deployment", "StatefulSet",
        "PodDisruptionBudget", "NetworkPolicy"}, "only expected kinds are rendered")
    return c.done()


if __name__ == "__main__":
    sys.exit(main())
