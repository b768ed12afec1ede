"""What tokenwire does with each OpenAI chat/completions parameter: honoured, accepted with
no effect on the output, or refused with a 400 naming it. Never accepted and ignored when
it would change the output. docs/http-api.md holds the same table for readers.

The fields named here are the request schema's opaque ones (gateway/openai/request.py
declares them from these tables): their values are judged here, not by type.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.errors import bad_request
from gateway.params import given

if TYPE_CHECKING:
    from gateway.openai.request import CommonRequest, CompletionRequest

# Fields that cannot change what is generated: accepted whatever their value.
NO_EFFECT = ("user", "metadata", "store", "service_tier", "safety_identifier",
             "prompt_cache_options", "prediction")


def _set(value) -> bool:
    return value not in (None, {}, [], "")


def _given(value) -> bool:  # where even an empty object asks for something
    return value is not None


# field -> (is the given value refused?, why): what the engine cannot do.
COMMON_REFUSED = {
    "logit_bias": (_set, "logit bias is not supported"),
}
CHAT_REFUSED = {
    "audio": (_given, "audio output is not supported"),
    "modalities": (lambda v: _set(v) and v != ["text"], "only [\"text\"] is supported"),
    "functions": (_set, "the deprecated functions are not supported; use tools"),
    "function_call": (_set, "the deprecated function_call is not supported; use tool_choice"),
    "reasoning_effort": (_given, "the models served here do not reason"),
    "verbosity": (_given, "not supported"),
    "web_search_options": (_given, "web search is not supported"),
    "moderation": (_given, "moderation is not supported"),
}
COMPLETION_REFUSED = {
    "suffix": (_set, "insertion (suffix) is not supported"),
}


def check(req: CommonRequest, max_choices: int, chat: bool) -> None:
    """Raise a 400 naming the first parameter this request sets that is refused."""
    refused = dict(COMMON_REFUSED)
    refused.update(CHAT_REFUSED if chat else COMPLETION_REFUSED)
    for name, (is_refused, why) in refused.items():
        if is_refused(getattr(req, name)):
            raise bad_request(f"{name}: {why}", name)
    if not 1 <= req.n <= max_choices:
        raise bad_request(f"n: must be in [1, {max_choices}]", "n")
    if not chat:
        _check_completion(req)


def _check_completion(req: CompletionRequest) -> None:
    if req.best_of not in (None, req.n):
        raise bad_request("best_of: only best_of equal to n is supported (every sample is "
                          "returned)", "best_of")
    if req.echo and given(req.logprobs):
        raise bad_request("echo: echo with logprobs needs the prompt's log-probabilities, "
                          "which are not computed", "echo")
