"""The composition root's own errors: what was asked cannot be done as asked."""


class UsageError(ValueError):
    """A command given input it cannot act on (exit 2, like argparse's own errors)."""


class RestoreError(Exception):
    """A restore that cannot be done; its message is the one line the user sees."""
