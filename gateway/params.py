"""Wire `params` -> SamplingParams, with the gateway's own caps applied."""
from __future__ import annotations

from engine.errors import InvalidRequestError
from engine.sampling_params import SamplingParams
from gateway.config import GatewayConfig
from gateway.protocol import ProtocolError


def build_params(config: GatewayConfig, *layers: dict | None,
                 request_id: str | None = None) -> SamplingParams:
    """Merge params maps (later layers win) into validated SamplingParams.

    Errors are `invalid_request` naming the field as `params.NAME`.
    """
    merged: dict = {}
    for layer in layers:
        merged.update(layer or {})
    try:
        params = SamplingParams.from_dict(merged, max_tokens=config.default_max_tokens)
    except InvalidRequestError as exc:
        field = exc.field if exc.field.startswith("params.") else f"params.{exc.field}"
        message = str(exc).split(": ", 1)[-1]
        raise ProtocolError("invalid_request", f"{field}: {message}", request_id) from None
    except (TypeError, ValueError) as exc:  # a wrong type the engine's checks let through
        raise ProtocolError("invalid_request", f"params: invalid value ({exc})",
                            request_id) from None
    if params.max_tokens > config.max_tokens_cap:
        raise ProtocolError("invalid_request", f"params.max_tokens: must be at most "
                            f"{config.max_tokens_cap}", request_id)
    return params
