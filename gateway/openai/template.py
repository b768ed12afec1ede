"""vLLM's chat-template extensions to chat completions, as widely sent clients (guidellm,
vLLM's own examples) use them: `add_generation_prompt`, `continue_final_message`,
`chat_template_kwargs` and `echo`. Each is checked here and becomes encode_chat's keyword
options, or the text a choice starts with."""
from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from gateway.errors import bad_request

if TYPE_CHECKING:
    from gateway.openai.request import ChatRequest

# The template's own variables and apply_chat_template's parameters: a kwarg of one of
# these names would replace the conversation, the tools or the rendering itself.
RESERVED = frozenset({
    "messages", "conversation", "conversations", "tools", "documents", "chat_template",
    "add_generation_prompt", "continue_final_message", "tokenize", "padding", "truncation",
    "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
    "tokenizer_kwargs", "raise_exception", "strftime_now"})


def template_options(req: ChatRequest, max_bytes: int) -> dict:
    """encode_chat's keyword options for this request; a 400 naming the field at fault."""
    if req.continue_final_message and req.add_generation_prompt:
        raise bad_request("continue_final_message: needs add_generation_prompt: false (the "
                          "final message is continued, no new one is opened)",
                          "continue_final_message")
    if req.continue_final_message and req.messages[-1].role != "assistant":
        raise bad_request("continue_final_message: the final message must be the "
                          "assistant's", "continue_final_message")
    return {"add_generation_prompt": req.add_generation_prompt,
            "continue_final_message": req.continue_final_message,
            "template_kwargs": _kwargs(req.chat_template_kwargs, max_bytes)}


def _kwargs(kwargs: dict | None, max_bytes: int) -> dict | None:
    """The extra template variables: small JSON, none named like the template's own."""
    if not kwargs:
        return None
    size = len(msgspec.json.encode(kwargs))
    if size > max_bytes:
        raise bad_request(f"chat_template_kwargs: {size} bytes, over the limit of "
                          f"{max_bytes} (max_chat_template_kwargs_bytes)",
                          "chat_template_kwargs")
    for name in kwargs:
        if name in RESERVED or name.endswith("_token") or not name.isidentifier():
            raise bad_request(f"chat_template_kwargs.{name[:64]}: not a variable a client "
                              "may set (the template's own, or not a name)",
                              f"chat_template_kwargs.{name[:64]}")
    return kwargs


def chat_echo(req: ChatRequest, messages: list[dict]) -> str:
    """vLLM's `echo`: the reply starts with the last message's content when that message
    has the reply's role (the assistant's, or with add_generation_prompt false the last
    message's own), so a continued message comes back whole."""
    if not req.echo:
        return ""
    role = "assistant" if req.add_generation_prompt else messages[-1]["role"]
    return messages[-1]["content"] if messages[-1]["role"] == role else ""
