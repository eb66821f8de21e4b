"""The reference model's user-facing error (its own module so that the package's lazy `__init__` and the
submodules that raise it do not import each other)."""


class InputError(ValueError):
    """Input the model cannot take (e.g. a token id outside [0, vocab_size))."""
