"""Splits a rendering into core resources (validated by kubernetes-validate against its bundled
schemas) and Prometheus Operator CRD resources (no bundled schema; assert_render.py checks them).

    python split.py RENDERED.yaml CORE.yaml CRDS.yaml    -> prints the number of core resources
"""

import sys

import yaml

from common import CRD_KINDS, load_docs

docs = load_docs(sys.argv[1])
core = [d for d in docs if d["kind"] not in CRD_KINDS]
crds = [d for d in docs if d["kind"] in CRD_KINDS]
for path, items in ((sys.argv[2], core), (sys.argv[3], crds)):
    with open(path, "w") as f:
        yaml.safe_dump_all(items, f, sort_keys=False)
print(len(core))
