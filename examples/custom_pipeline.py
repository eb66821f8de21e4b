"""Run a pipeline of your choice over IR text with `dsv41c opt`.

    python3 examples/custom_pipeline.py [OUT_DIR]

Writes a small function as IR text (the syntax every dump uses), then runs
`dsv41c opt IN.ir -p canonicalize,cse,dce --verify-each --dump-dir D`: a `1 * x` folds away,
the second of two equal `exp`s merges into the first, the dead `view` goes. Any compile dump
can be fed back the same way to replay one pass (`-p fold-shapes`, `-p cse`, ...).
"""
import os
import subprocess
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "out/examples"
os.makedirs(out, exist_ok=True)
src = os.path.join(out, "small.ir")
with open(src, "w") as f:
    f.write("""\
func @f(%x: f32[T, 8]) -> (f32[T, 8], f32[T, 8]) {
  %dead = aten.view(%x) {size = [T, 2, 4]} : (f32[T, 8]) -> f32[T, 2, 4]
  %one = aten.mul(%x) {other = 1.0} : (f32[T, 8]) -> f32[T, 8]
  %a = aten.exp(%one) : (f32[T, 8]) -> f32[T, 8]
  %b = aten.exp(%one) : (f32[T, 8]) -> f32[T, 8]
  return %a, %b
}
""")
cmd = [sys.executable, "-m", "dsv41c", "opt", src, "-p", "canonicalize,cse,dce", "--verify-each",
       "--dump-dir", os.path.join(out, "opt-dumps")]
result = subprocess.run(cmd, capture_output=True, text=True, check=True)
print(result.stdout, end="")
assert "aten.mul" not in result.stdout and result.stdout.count("aten.exp") == 1
assert "return %a, %a" in result.stdout
print("dumps:", sorted(os.listdir(os.path.join(out, "opt-dumps"))))
