"""Chat messages as clients send them (v1 `generate`, OpenAI chat) and as the chat
template takes them: `developer` is a system message, text content parts are joined."""
from __future__ import annotations

import msgspec

from engine.errors import PromptTooLongError
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


def fit_to_context(encode_chat, messages: list[dict], room: int, max_len: int,
                   step: int = 1) -> list[int]:
    """The chat template's token ids for `messages`, the oldest non-system messages dropped
    `step` at a time (2: a user turn and its reply) until `room` more tokens fit in
    `max_len`, keeping at least the last message (one that alone does not fit is the
    engine's too_large to report).

        drops:   0    1    2  ...  k  ...  most      (fits? monotone: dropping never grows it)
                 no   no   no      yes      yes   -> the fewest drops that fit, by bisection

    Each render is linear in the conversation, and bisection takes log2(messages) of them:
    a long history costs O(n log n), where dropping one message at a time cost O(n^2).
    A render too long in characters to fit is refused before it is encoded (the engine's
    PromptTooLongError): no fit, found at the cost of the render alone."""
    first = 1 if messages and messages[0]["role"] == "system" else 0
    remaining = len(messages) - first

    def kept(drops: int) -> list[dict]:
        return messages[:first] + messages[first + drops * step:]

    def render(drops: int) -> list[int] | None:
        """None: refused by its length before encoding."""
        try:
            return encode_chat(kept(drops))
        except PromptTooLongError:
            return None

    def fits(prompt: list[int] | None) -> bool:
        return prompt is not None and len(prompt) + room <= max_len

    prompt = render(0)
    most = -(-(remaining - 1) // step) if remaining > 1 else 0
    if fits(prompt) or most == 0:
        return prompt if prompt is not None else encode_chat(kept(0))  # raises again
    low, high, found = 0, most, {}  # render(low) does not fit; render(high) fits, or high
    while high - low > 1:           # is `most` (then nothing fits: too_large, later)
        mid = (low + high) // 2
        candidate = render(mid)
        if fits(candidate):
            high, found[mid] = mid, candidate
        else:
            low = mid
    prompt = found.get(high) or render(high)
    return prompt if prompt is not None else encode_chat(kept(high))  # raises again
