"""Exceptions the CLI turns into one clear line and exit status 2."""


class NopeinterpError(Exception):
    """Base class for user-facing errors (bad input, not a bug)."""


class CheckpointError(NopeinterpError, ValueError):
    """A file that is missing, not a nopeinterp checkpoint, damaged or unsafe."""


class TaskError(NopeinterpError, ValueError):
    """A bad task name, option or request (the CLI prints it as one line, exit status 2)."""
