"""The composition root's own error: what was asked cannot be done as asked."""


class UsageError(ValueError):
    """A command given input it cannot act on (exit 2, like argparse's own errors)."""
