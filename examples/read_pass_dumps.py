"""Read what each pass of a compile did, from its dumps.

    python3 examples/read_pass_dumps.py [OUT_DIR]

Compiles the tiny preset with `dump_dir` (the `--dump-dir` of `dsv41c compile`): the IR
before the pipeline (`00_input.ir`), after each pass (`NN_<pass>.ir`), a unified diff per
pass (`NN_<pass>.diff`) and `index.json`. Value names are stable across passes, so a diff
holds only the ops the pass changed. Prints each pass's statistics and diff size, and the
first hunk of fold-shapes' diff.
"""
import json
import os
import sys

from dsv41c.driver import build_artifact

out = sys.argv[1] if len(sys.argv) > 1 else "out/examples"
dumps = os.path.join(out, "dumps")
build_artifact(os.path.join(out, "tiny-dumped.dsv41c"), preset="tiny", dump_dir=dumps, force=True)

with open(os.path.join(dumps, "index.json")) as f:
    index = json.load(f)
for p in index["passes"]:
    diff = os.path.join(dumps, p["files"][1]) if p.get("files") else None
    lines = 0
    if diff:
        with open(diff) as f:
            lines = sum(1 for ln in f if ln[:1] in "+-" and ln[:3] not in ("+++", "---"))
    print(f"{p['index']:2} {p['name']:<14} changed={p['changed']!s:<5} diff lines={lines:<6} {p['stats']}")

with open(os.path.join(dumps, "01_fold-shapes.diff")) as f:
    text = f.read()
hunks = text.split("\n@@")
print("first hunk of fold-shapes:\n@@" + hunks[1] if len(hunks) > 1 else "fold-shapes changed nothing")
