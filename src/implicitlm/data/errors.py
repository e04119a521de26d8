"""Errors raised by the data modules."""


class DataError(ValueError):
    """A malformed or inconsistent data file; the message is one line naming the file."""
