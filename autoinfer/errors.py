"""The one exception type that reaches the user as a one-line message (exit status 2)."""


class UserError(Exception):
    """Bad input the user can fix: the message names the problem and the fix, on one line."""
