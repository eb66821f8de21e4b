"""Compile the tiny preset and run it through the Python API.

    python3 examples/compile_and_run.py [ARTIFACT]

Compiles `--preset tiny` (the official 40-layer topology, small widths, a seeded random
checkpoint written inside the artifact) into ARTIFACT (default out/examples/tiny.dsv41c)
unless it already exists, loads it with `dsv41c.load`, prefills a prompt in one session,
decodes three tokens by hand, and checks that `generate` gives the same tokens.
"""
import os
import sys

import torch

import dsv41c
from dsv41c.driver import build_artifact

path = sys.argv[1] if len(sys.argv) > 1 else "out/examples/tiny.dsv41c"
if not os.path.isdir(path):
    build_artifact(path, preset="tiny")  # the same as `dsv41c compile --preset tiny -o PATH`

model = dsv41c.load(path)  # validates the manifest, binds the checkpoint it names
print(model)

prompt = [5, 17, 42, 7, 99, 3]
session = model.new_session()
logits = model.prefill(session, prompt)  # [len(prompt), vocab]
print("prefill logits", tuple(logits.shape))

tokens = []
for _ in range(3):
    tok = int(torch.argmax(session.last_logits))  # greedy
    tokens.append(tok)
    model.decode(session, tok)
print("decoded by hand:", tokens)

assert model.generate(prompt, max_new_tokens=3) == tokens
print("generate agrees")
