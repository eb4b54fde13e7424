"""Errors raised on one floor and reported on another, kept on the lowest floor so that raising one imports
nothing above: ``plugins`` raises ``ConfigError`` while ``training.config``, which loads the plugins, raises
and documents it too (importing it from there made the two modules import each other)."""


class ConfigError(ValueError):
    """A bad configuration; the message is one line."""
