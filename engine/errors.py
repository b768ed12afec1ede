"""Exceptions the engine raises at its boundary; each request error maps to one protocol
error code. Importing this module loads no torch. ConfigError, every layer's
bad-configuration error, lives in the leaf package `common` and is named here too."""

from common.errors import ConfigError

__all__ = ["ConfigError", "EngineDeadError", "EngineError", "InvalidRequestError",
           "ModelLoadError", "PromptTooLongError"]


class EngineError(Exception):
    """Base class of every error the engine reports to callers."""

    code = "internal"


class InvalidRequestError(EngineError, ValueError):
    """A request parameter is missing, ill-typed or out of range; `field` names it."""

    code = "invalid_request"

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class PromptTooLongError(EngineError, ValueError):
    """The prompt (plus at least one generated token) does not fit in the context."""

    code = "too_large"


class ModelLoadError(EngineError, RuntimeError):
    """The model could not be found or loaded."""


class EngineDeadError(EngineError, RuntimeError):
    """The engine loop has stopped; no request can be served."""
