"""One Realtime response: the events that open and close it, and its stream's frames.

    response.created, rate_limits.updated, response.output_item.added,
    response.content_part.added                            (opening(), when accepted)
    response.output_text.delta ...                         (the writer, as tokens come)
    response.output_text.done                              (the writer: the stream's `done`)
    response.content_part.done, response.output_item.done,
    [conversation.item.added, conversation.item.done]      (in-band replies only)
    response.done                                          (closing())

A response refused before it streamed (overloaded, too_large, ...) gets an `error` and
then closes the same way, with status `failed`, so a client never waits for ever.
"""
from __future__ import annotations

from engine.outputs import RequestOutput
from gateway.realtime import server
from gateway.realtime.conversation import new_id
from gateway.stream import Stream

# finish_reason -> (status, status_details.reason)
_STATUS = {"stop": ("completed", None), "length": ("incomplete", "max_output_tokens"),
           "cancelled": ("cancelled", None), "error": ("failed", None)}


class Response:
    """What a response.create asked for, and how it ended; the shaper of its stream's
    frames (output_text deltas, then output_text.done in place of `done`)."""

    def __init__(self, event_id: str | None, conversation_id: str | None,
                 max_tokens: int, metadata: dict | None):
        self.id = new_id("resp")
        self.item_id = new_id("item")
        self.event_id = event_id
        self.conversation_id = conversation_id  # None: out-of-band
        self.max_tokens = max_tokens
        self.metadata = metadata
        self.client_cancelled = False
        self.error: dict | None = None  # {type, code, message} of a refusal or failure

    @property
    def in_band(self) -> bool:
        return self.conversation_id is not None

    def body(self, status: str, stream: Stream | None = None, details: dict | None = None,
             output: list[dict] = ()) -> dict:
        body = {"object": "realtime.response", "id": self.id, "status": status,
                "status_details": details, "output": list(output),
                "conversation_id": self.conversation_id, "output_modalities": ["text"],
                "max_output_tokens": self.max_tokens, "metadata": self.metadata}
        if stream is not None:
            body["usage"] = server.usage(stream.prompt_tokens, stream.completion_tokens,
                                         stream.cached_tokens)
        return body

    def opening(self, rate_limits: dict) -> list[dict]:
        where = {"response_id": self.id, "output_index": 0}
        return [server.event("response.created", response=self.body("in_progress")),
                rate_limits,
                server.event("response.output_item.added", **where,
                             item=server.item(self.item_id, "assistant", "", "in_progress")),
                server.event("response.content_part.added", **where, item_id=self.item_id,
                             content_index=0, part={"type": "text", "text": ""})]

    def closing(self, stream: Stream, previous_item_id: str | None,
                in_conversation: bool) -> list[dict]:
        status, reason = _STATUS[stream.finish_reason or "error"]
        details = None
        if status != "completed":
            reason = "client_cancelled" if self.client_cancelled else reason
            error = self.error
            if error is None and stream.error:  # a drain's cut, an engine fault mid-stream
                error = {"type": "server_error", "code": None, "message": stream.error}
            details = {"type": status, "reason": reason, "error": error}
        text = stream.text
        item = server.item(self.item_id, "assistant", text,
                           "completed" if status == "completed" else "incomplete")
        where = {"response_id": self.id, "output_index": 0}
        events = [] if stream.finish_reason else [self.text_done(stream)]
        events += [server.event("response.content_part.done", **where, item_id=self.item_id,
                                content_index=0, part={"type": "text", "text": text}),
                   server.event("response.output_item.done", **where, item=item)]
        if in_conversation:
            events += [server.event(kind, item=item, previous_item_id=previous_item_id)
                       for kind in ("conversation.item.added", "conversation.item.done")]
        events.append(server.event("response.done", response=self.body(
            status, stream, details, [item])))
        return events

    # -- Shaper: the frames of its stream -----------------------------------------------
    def delta_frame(self, stream: Stream, out: RequestOutput) -> dict:
        # Realtime text responses never ask for log-probabilities.
        return server.event("response.output_text.delta", response_id=self.id,
                            item_id=self.item_id, output_index=0, content_index=0,
                            delta=out.delta_text)

    def done_frame(self, stream: Stream, now: float) -> dict:
        return self.text_done(stream)

    def text_done(self, stream: Stream) -> dict:
        return server.event("response.output_text.done", response_id=self.id,
                            item_id=self.item_id, output_index=0, content_index=0,
                            text=stream.text)
