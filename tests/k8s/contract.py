"""The config contract of common.py against its sources, and the chart's values against it.

    python contract.py

- The sections and keys of CONFIG_KEYS are exactly the fields of the proxy's config structs, in
  order: `Config` in src/config.rs names one struct per section, found anywhere under src/
  (so a key added to the proxy without the chart fails here, not in production); a field whose
  type is another `...Config` struct is a nested section (`[log.redis]`).
- CONFIG_DEFAULTS equals the `impl Default` of each section's struct (a `#[derive(Default)]`
  struct: every key absent; `tls.reload_secs` absent means tls::DEFAULT_RELOAD_SECS), and
  proxy.toml.example, which the proxy's own unit test (`example_file_parses_to_defaults`) proves
  equal to its defaults.
- values.yaml's proxy.config holds every key the chart does not set itself, with the proxy's
  default (upstream.sse_url: empty, i.e. the MCP server over loopback).
- values.schema.json's proxy.config describes exactly those keys and refuses others.
- values/everything.yaml changes every one of them.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib

import yaml

from common import CHART, CONFIG_DEFAULTS, CONFIG_DERIVED, CONFIG_KEYS, HOST_NAME, ROOT, Checks
from common import section as table_of

SRC = ROOT / "src"


STRUCTS: dict[str, str] = {}  # section -> struct name


def struct_fields(name: str) -> list[tuple[str, str]] | None:
    """The `pub` fields of `pub struct NAME { ... }` somewhere under src/, in order, with their types."""
    for path in sorted(SRC.rglob("*.rs")):
        text = path.read_text()
        m = re.search(r"^pub struct " + re.escape(name) + r" \{\n(.*?)^\}", text, re.M | re.S)
        if not m:
            continue
        body = m.group(1)
        if "#[serde(rename" in body or "#[serde(flatten" in body or "#[serde(alias" in body:
            raise SystemExit(f"{path}: {name} renames, flattens or aliases fields; teach contract.py")
        return re.findall(r"^\s+pub (\w+): ([^\n]+),$", body, re.M)
    return None


def _rust_value(expr: str, field: str) -> object:
    """A default's Rust expression as the TOML value it stands for (the forms src/ uses)."""
    e = expr.strip()
    if re.fullmatch(r"[0-9_]+(\s*\*\s*[0-9_]+)*", e):
        out = 1
        for n in e.split("*"):
            out *= int(n.strip().replace("_", ""))
        return out
    if e in ("true", "false"):
        return e == "true"
    if e == "None":
        return None
    if e == "host_name()":
        return HOST_NAME
    if re.fullmatch(r"\w+::default\(\)", e):
        return None  # a nested section's struct: its own defaults are read as a section
    if e in ("Vec::new()", "vec![]"):
        return []
    if e == "String::new()":
        return ""
    m = re.fullmatch(r'"((?:[^"\\]|\\.)*)"\.into\(\)|PathBuf::from\("((?:[^"\\]|\\.)*)"\)', e)
    if m:
        return m.group(1) if m.group(1) is not None else m.group(2)
    m = re.fullmatch(r"vec!\[(.*)\]", e, re.S)
    if m:
        return [_rust_value(x, field) for x in m.group(1).split(",") if x.strip()]
    m = re.fullmatch(r"\w+::(\w+)", e)
    if m:  # a unit enum variant, serde(rename_all = "lowercase")
        return m.group(1).lower()
    raise SystemExit(f"default of `{field}`: cannot read `{e}`; teach contract.py")


def _split_top(body: str) -> list[str]:
    """Splits `a: x, b: vec![y, z]` at the commas outside brackets and parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def struct_defaults(name: str, fields: list[str]) -> dict[str, object]:
    """The values of `impl Default for NAME`, or all None for a `#[derive(Default)]` struct."""
    for path in sorted(SRC.rglob("*.rs")):
        text = path.read_text()
        m = re.search(r"^impl Default for " + re.escape(name) + r" \{.*?^\s+Self \{", text, re.M | re.S)
        if m:
            depth, i = 1, m.end()
            while depth:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            out = {}
            for part in _split_top(text[m.end():i - 1]):
                key, _, expr = part.partition(":")
                out[key.strip()] = _rust_value(expr, key.strip())
            return out
        if re.search(r"#\[derive\([^)]*\bDefault\b[^)]*\)\]\n(#\[.*\]\n)*pub struct " + re.escape(name) + r" \{", text):
            return {f: None for f in fields}
    raise SystemExit(f"no Default of {name} under src/")


def source_sections() -> dict[str, list[str]]:
    text = (SRC / "config.rs").read_text()
    m = re.search(r"^pub struct Config \{\n(.*?)^\}", text, re.M | re.S)
    if not m:
        raise SystemExit("src/config.rs: no `pub struct Config`")
    out = {}
    for field, typ in re.findall(r"^\s+pub (\w+): ([\w:]+),", m.group(1), re.M):
        struct = typ.rsplit("::", 1)[-1]
        fields = struct_fields(struct)
        if fields is None:
            raise SystemExit(f"no `pub struct {struct}` under src/ (section [{field}])")
        nested = [(f, t) for f, t in fields if t.endswith("Config") and struct_fields(t.rsplit("::", 1)[-1]) is not None]
        out[field] = [f for f, _ in fields if (f, _) not in nested]
        STRUCTS[field] = struct
        for sub, t in nested:
            out[f"{field}.{sub}"] = [f for f, _ in struct_fields(t.rsplit("::", 1)[-1])]
            STRUCTS[f"{field}.{sub}"] = t.rsplit("::", 1)[-1]
    return out


def main() -> int:
    c = Checks("config contract")

    src = source_sections()
    c.eq(list(src), list(CONFIG_KEYS), "common.py CONFIG_KEYS sections == src/config.rs Config fields (in order)")
    for section, fields in src.items():
        c.eq(CONFIG_KEYS.get(section), fields, f"common.py CONFIG_KEYS[{section!r}] == the fields of its struct (in order)")
    c.eq({s: list(d) for s, d in CONFIG_DEFAULTS.items()}, CONFIG_KEYS, "CONFIG_DEFAULTS has exactly the keys of CONFIG_KEYS")
    reload = re.search(r"pub const DEFAULT_RELOAD_SECS: u64 = (\d+);", (SRC / "tls.rs").read_text())
    for section, fields in src.items():
        defaults = struct_defaults(STRUCTS[section], fields)
        if section == "tls" and defaults.get("reload_secs") is None and reload:
            defaults["reload_secs"] = int(reload.group(1))  # absent: tls::DEFAULT_RELOAD_SECS
        for key in fields:
            c.eq(CONFIG_DEFAULTS.get(section, {}).get(key, "<missing>"), defaults.get(key, "<missing>"),
                 f"default of {section}.{key} == impl Default for {STRUCTS[section]}")

    example = tomllib.loads((ROOT / "proxy.toml.example").read_text())
    unchecked = []
    for sec, keys in CONFIG_KEYS.items():
        shown = table_of(example, sec)
        for key in keys:
            if key in shown:
                c.eq(CONFIG_DEFAULTS[sec][key], shown[key], f"default of {sec}.{key} == proxy.toml.example")
            else:
                unchecked.append(f"{sec}.{key}")
        for key in shown:
            c.check(key in keys, f"proxy.toml.example's {sec}.{key} is in the contract")
    tops = {s.split(".")[0] for s in CONFIG_KEYS}
    c.check(set(example) <= tops, f"proxy.toml.example's sections are in the contract ({sorted(example)})")
    print(f"defaults not shown in proxy.toml.example (checked against src/ only): {', '.join(unchecked)}")

    with open(CHART / "values.yaml") as f:
        pc = yaml.safe_load(f)["proxy"]["config"]
    settable = {s: [k for k in keys if (s, k) not in CONFIG_DERIVED] for s, keys in CONFIG_KEYS.items()}
    settable = {s: keys for s, keys in settable.items() if keys}  # [admin] has only its address
    c.eq(sorted(pc), sorted({s.split(".")[0] for s in settable}), "values.yaml proxy.config sections")
    c.eq({s: sorted(table_of(pc, s)) for s in settable}, {s: sorted(k) for s, k in settable.items()},
         "values.yaml proxy.config has exactly the keys the chart does not set itself")
    for sec, keys in settable.items():
        for key in keys:
            want = "" if (sec, key) == ("upstream", "sse_url") else CONFIG_DEFAULTS[sec][key]
            c.eq(table_of(pc, sec).get(key), want, f"values.yaml proxy.config.{sec}.{key} is the proxy's default")

    with open(CHART / "values.schema.json") as f:
        schema = json.load(f)["properties"]["proxy"]["properties"]["config"]
    c.eq(schema.get("additionalProperties"), False, "schema: proxy.config refuses unknown sections")
    c.eq(sorted(schema["properties"]), sorted({s.split(".")[0] for s in settable}), "schema: proxy.config sections")
    for sec, keys in settable.items():
        node = schema
        for part in sec.split("."):
            node = node.get("properties", {}).get(part, {})
        nested = [n.split(".")[-1] for n in settable if n.startswith(sec + ".")]
        c.eq(node.get("additionalProperties"), False, f"schema: proxy.config.{sec} refuses unknown keys")
        c.eq(sorted(k for k in node.get("properties", {}) if k not in nested), sorted(keys), f"schema: proxy.config.{sec} keys")

    with open(ROOT / "tests" / "k8s" / "values" / "everything.yaml") as f:
        every = yaml.safe_load(f)["proxy"]["config"]
    for sec, keys in settable.items():
        for key in keys:
            if (sec, key) == ("upstream", "sse_url"):
                continue  # derived from mcpServer.port/ssePath, which everything.yaml changes
            got = table_of(every, sec).get(key, "<unset>")
            c.check(got != "<unset>" and got != table_of(pc, sec)[key],
                    f"values/everything.yaml changes proxy.config.{sec}.{key} (got {got!r})")
    return c.done()


if __name__ == "__main__":
    sys.exit(main())
