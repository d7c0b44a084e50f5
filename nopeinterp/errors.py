"""Exceptions the CLI turns into one clear line and exit status 2."""


class NopeinterpError(Exception):
    """Base class for user-facing errors (bad input, not a bug)."""


class CheckpointError(NopeinterpError, ValueError):
    """A file that is missing, not a nopeinterp checkpoint, damaged or unsafe."""


class TaskError(NopeinterpError, ValueError):
    """A bad task name, option or request (the CLI prints it as one line, exit status 2)."""


def check_choice(value, choices, what: str, *, error: type[Exception] = NopeinterpError, where=""):
    """`value` if it is one of `choices`, else `error` naming them: the one wording of every
    "unknown ...; choose one of ..." refusal (`where`, e.g. " in 'copy:x=1'", follows the
    value)."""
    if value not in choices:
        names = ", ".join(map(str, choices))
        raise error(f"unknown {what} {value!r}{where}; choose one of {names}")
    return value
