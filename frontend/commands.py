"""CLI handlers of the frontend: init-checkpoint, plan, reference, generate."""
from __future__ import annotations

import json
import sys

from dsv41c.frontend.config import ConfigError, load_config, preset
from dsv41c.frontend.layer_plan import plan_as_json, plan_as_table


def _config_of(args):
    if getattr(args, "preset", None) and getattr(args, "checkpoint", None):
        raise ConfigError("give either CKPT_DIR or --preset, not both")
    if getattr(args, "preset", None):
        return preset(args.preset)
    if not getattr(args, "checkpoint", None):
        raise ConfigError("give CKPT_DIR or --preset")
    return load_config(args.checkpoint)


def cmd_plan(args) -> int:
    cfg = _config_of(args)
    if args.json:
        json.dump(plan_as_json(cfg), sys.stdout, indent=1)
        print()
    else:
        print(plan_as_table(cfg))
    return 0
