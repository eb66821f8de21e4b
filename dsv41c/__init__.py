"""dsv41c: an ahead-of-time compiler and runtime for DeepSeek-V4.1-Flash.

The component folders at the repository's top (frontend/, ir/, passes/, codegen/,
runtime/) are this package's subpackages. An installed copy has them under dsv41c/;
a source checkout keeps them one level up, so this module extends its own search path
to the checkout's root when it finds the components there.
"""
import os as _os

__version__ = "0.1.0"

_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "frontend", "__init__.py")) and _root not in __path__:
    __path__.append(_root)


def load(path, device=None, checkpoint=None, interpret=False, seeded_weights=None):
    """Load a compiled artifact (see dsv41c.runtime.loader.load)."""
    from dsv41c.runtime.loader import load as _load

    return _load(path, device=device, checkpoint=checkpoint, interpret=interpret, seeded_weights=seeded_weights)
