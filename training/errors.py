"""User-facing errors: every stage raises a subclass, and the CLI prints it as one line, no traceback."""


class GristmillError(ValueError):
    """Bad input or config. The message names the file or key and says how to fix it."""
