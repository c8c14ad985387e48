"""Errors a user can fix. The CLI prints them as one sentence and exits with code 2."""


class UsageError(Exception):
    """Bad input: a flag, a use-case file or a data folder that cannot be used as given."""


class ConfigError(UsageError):
    """A configuration value is invalid; the message names the field and what is allowed."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


class DataError(UsageError):
    """The data set cannot be used: a missing class, an unreadable image, an empty folder."""


class Unavailable(ConfigError):
    """The configuration is valid but this machine or this version cannot run it: a GPU
    strategy without GPUs, a backend or a combination not available. A study records
    such a cell as skipped, with this message as the reason."""


class NotHere(Unavailable):
    """Unavailable for want of this machine's hardware (GPUs): a study submitted to a
    cluster leaves it to the node its job runs on."""
