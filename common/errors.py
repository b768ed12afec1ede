"""ConfigError: the one error type for bad configuration, in every layer's config."""


class ConfigError(ValueError):
    """A configuration field is out of range; `field` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
