"""Number formats, re-exported for the compiler side.

The codecs live in `dsv41c.formats`, a leaf module that both the compiler and the runtime
import (the runtime must not import the compiler, and both need the same FP8/FP4/E8M0
rules). See that module for the algorithms.
"""
from dsv41c.formats import *  # noqa: F401,F403
from dsv41c.formats import (E2M1_LUT, E2M1_MAX, E4M3_MAX, _blocks, e2m1_decode, e2m1_encode,  # noqa: F401
                            e2m1_lut, e8m0_to_float, float_to_e8m0, pow2_ceil_exponent)
