"""dsv41c's passes: one pass per file, a lazy name -> pass registry, and the pipeline.

- `base.py`: `ModulePass` (frozen dataclass: `name`, options as fields, `run(module) ->
  PassResult(module, changed, stats)`), `PassError`, the kill switch `DSV41C_DISABLE_<PASS>`;
- `registry.py`: CLI name -> class, `parse_pipeline("fold-shapes{bind=\\"T=1\\"},cse")`;
- `manager.py`: `PassManager(passes, verify_each=, timings=, dump_dir=, dump_filter=,
  instruments=)` with the timing, verify-each, dump and numeric-oracle instruments;
- `rewrite.py`: the named-pattern driver and the liveness sweep the passes share;
- passes: `dce.py`, `cse.py`, `canonicalize.py`, `fold_shapes.py` (file = CLI name);
- `pipeline.py`: the whole pipeline as one list; `commands.py`: `dsv41c opt`.
"""
