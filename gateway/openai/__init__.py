"""OpenAI's HTTP API: /v1/models, /v1/models/{id}, /v1/chat/completions, /v1/completions
(docs/http-api.md).

    routes.py    the handlers: a body -> prompts and params -> admission -> the answer
    request.py   body schemas (the sampling fields are gateway.params.Params) and 400s
    support.py   which OpenAI parameter is honoured, has no effect, or is refused
    template.py  vLLM's chat-template extensions (chat_template_kwargs, echo, ...)
    choices.py   prompts x n samples, run side by side
    answer.py    one JSON body, or Server-Sent Events
    v1_errors.py unknown routes and methods under /v1 in OpenAI's error shape
"""
from gateway.openai.routes import (chat_completions, completions, load_model, model, models,
                                   unload_model)
from gateway.openai.v1_errors import v1_errors

__all__ = ["chat_completions", "completions", "load_model", "model", "models", "unload_model",
           "v1_errors"]
