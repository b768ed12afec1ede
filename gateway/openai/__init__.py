"""OpenAI's HTTP API: /v1/models, /v1/chat/completions, /v1/completions (docs/http-api.md).

    routes.py    the handlers: a body -> prompts and params -> admission -> the answer
    request.py   body schemas (the sampling fields are gateway.params.Params) and 400s
    support.py   which OpenAI parameter is honoured, has no effect, or is refused
    choices.py   prompts x n samples, run side by side
    answer.py    one JSON body, or Server-Sent Events
"""
from gateway.openai.routes import chat_completions, completions, models

__all__ = ["chat_completions", "completions", "models"]
