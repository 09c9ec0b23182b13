"""The installed Steward's version, as `--version`, backups and exports record it: looked
up only when asked (importlib.metadata reads the package's files)."""


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("steward")
    except PackageNotFoundError:
        return "unknown (not installed)"
