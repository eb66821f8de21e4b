"""The kernel matrix and ahead-of-time kernel binaries for two targets, on a machine with no GPU.

    python3 examples/kernels_for_two_targets.py [OUT_DIR]

Prints the kernel matrix's table for cuda:sm90 and rocm:gfx942 (which template has a native
variant, a generic fallback, or none on each), then builds two templates' binaries for both
with `dsv41c kernels --build --templates REGEX -j 2` (PTX + cubin for sm90, AMDGCN + HSACO for
gfx942) through the kernel cache, and lists what the build manifest says of each kernel.
A second run finds every kernel in the cache ($DSV41C_CACHE_DIR, else ~/.cache/dsv41c).
"""
import json
import os
import subprocess
import sys

from dsv41c.codegen.matrix import KernelMatrix

out = sys.argv[1] if len(sys.argv) > 1 else "out/examples"
targets = ["cuda:sm90", "rocm:gfx942"]

table = KernelMatrix.build(targets).render()
print("\n".join(table.splitlines()[:12]), "\n...")

kdir = os.path.join(out, "kernels")
subprocess.run([sys.executable, "-m", "dsv41c", "kernels", "--build", "--targets", ",".join(targets),
                "--templates", "^(fp8_ue8m0_dequant|add_rmsnorm)$", "-j", "2", "-o", kdir], check=True)

with open(os.path.join(kdir, "manifest.json")) as f:
    manifest = json.load(f)
for k in manifest["kernels"]:
    print(f"{k['target']:<12} {k['template']}/{k['variant']}: {k['status']}, entry {k.get('entry')}, "
          f"files {sorted(k.get('files', {}).values())}")
assert manifest["summary"]["failed"] == 0 and manifest["summary"]["built"] == 4
