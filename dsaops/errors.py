"""The one error a user sees: bad input or a missing prerequisite, printed in one line, exit 2."""


class UserError(Exception):
    """Bad input or a missing prerequisite: the CLI prints it without a traceback and exits 2."""
