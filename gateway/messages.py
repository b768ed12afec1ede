"""Chat messages as clients send them (v1 `generate`, OpenAI chat) and as the chat
template takes them: `developer` is a system message, text content parts are joined."""
from __future__ import annotations

import msgspec

from gateway.errors import RequestError

ROLES = frozenset({"system", "developer", "user", "assistant"})


class ContentPart(msgspec.Struct):
    """One part of a message's content; only `text` parts are served."""

    type: str
    text: str = ""


def message_dict(index: int, role: str, content, roles=ROLES) -> dict:
    """A chat message as the chat template takes it. Raises RequestError naming the field."""
    if role not in roles:
        raise RequestError("invalid_request",
                           f"messages[{index}].role: must be one of {sorted(roles)}",
                           param=f"messages[{index}].role")
    return {"role": "system" if role == "developer" else role,
            "content": content_text(index, content)}


def content_text(index: int, content: str | list[ContentPart] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    for j, part in enumerate(content):
        if part.type != "text":
            raise RequestError("invalid_request", f"messages[{index}].content[{j}].type: "
                               f"only text parts are supported, not {part.type[:32]!r}",
                               param=f"messages[{index}].content[{j}].type")
    return "".join(part.text for part in content)
