"""The one error type every stage raises for a problem the user can fix (run.py prints it without a traceback)."""


class GrpoLabError(Exception):
    """A problem the user can fix; its message says how. Printed without a traceback."""
