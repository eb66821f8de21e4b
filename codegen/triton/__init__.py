"""The Triton kernels. Importing the package records triton.language as imported, before any interpreted launch can
leave it patched (interpreter_leaks.py), so a later compile in the same process can put it back."""
from dsv41c.codegen.triton import interpreter_leaks as _interpreter_leaks

_interpreter_leaks.record()
