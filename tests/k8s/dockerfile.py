"""Static checks of the Dockerfile and .dockerignore (no container engine runs here).

    python dockerfile.py
"""

from __future__ import annotations

import re
import shlex
import sys

from common import ROOT, Checks


def instructions(text: str) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def main() -> int:
    c = Checks("Dockerfile")
    ins = instructions((ROOT / "Dockerfile").read_text())
    froms = [i for i, (w, _) in enumerate(ins) if w == "FROM"]
    c.check(len(froms) >= 2, "multi-stage build")
    build = ins[froms[0]:froms[-1]]
    runtime = ins[froms[-1]:]
    c.check(any(w == "COPY" and "Cargo.lock" in a for w, a in build), "build stage copies the committed Cargo.lock")
    c.check(any(w == "RUN" and "cargo build" in a and "--release" in a and "--locked" in a for w, a in build),
            "build stage runs cargo build --release --locked")
    c.check(any(w == "COPY" and "--from=" in a and "mcp-resume-proxy" in a for w, a in runtime),
            "runtime stage copies only the binary from the build stage")
    users = [a for w, a in runtime if w == "USER"]
    c.check(users and users[-1].split(":")[0] not in ("root", "0"), f"runtime runs as a non-root user ({users})")
    entry = [a for w, a in runtime if w == "ENTRYPOINT"]
    c.check(entry and entry[-1].startswith("[") and "mcp-resume-proxy" in entry[-1],
            "ENTRYPOINT is the binary (exec form)")
    c.check(any(w == "VOLUME" and "/data" in a for w, a in runtime), "VOLUME /data")
    c.check(("STOPSIGNAL", "SIGTERM") in runtime, "STOPSIGNAL SIGTERM")
    exposed = {p for w, a in runtime if w == "EXPOSE" for p in shlex.split(a)}
    c.check({"8080", "9090"} <= exposed, f"EXPOSE 8080 9090 ({sorted(exposed)})")

    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    c.check(any(p.strip("/") == "target" for p in ignore), ".dockerignore excludes target/")
    c.check(not any(p.strip("/") in ("Cargo.lock", "src", "Cargo.toml") for p in ignore),
            ".dockerignore keeps the sources and Cargo.lock")
    return c.done()


if __name__ == "__main__":
    sys.exit(main())
