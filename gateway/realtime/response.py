"""One Realtime response: the events that open and close it, and its stream's frames.

    response.created, rate_limits.updated, response.output_item.added,
    response.content_part.added                            (opening(), when accepted)
    response.output_text.delta ...                         (the writer, as tokens come)
    response.output_text.done                              (the writer: the stream's `done`)
    response.content_part.done, response.output_item.done,
    [conversation.item.added, conversation.item.done]      (in-band replies only)
    response.done                                          (closing())

With tools, the text is read by the tool-call parser as it streams (as the Responses
API's is, gateway/responses/shape.py): the message item opens when content first
appears, and each call is a `function_call` item of its own, sent whole as it is read
(output_item.added, function_call_arguments.delta and .done, output_item.done); the
stream's `done` carries what was still held and closes the message item. The conversation
gets one item per output, in order.

A response refused before it streamed (overloaded, too_large, ...) gets an `error` and
then closes the same way, with status `failed`, so a client never waits for ever.
"""
from __future__ import annotations

from engine.outputs import RequestOutput
from gateway.realtime import server
from gateway.realtime.conversation import new_id
from gateway.stream import Stream
from gateway.tools.events import function_call_events
from gateway.tools.parser import ToolCall
from gateway.tools.plan import ToolPlan

# finish_reason -> (status, status_details.reason)
_STATUS = {"stop": ("completed", None), "length": ("incomplete", "max_output_tokens"),
           "cancelled": ("cancelled", None), "error": ("failed", None)}
_MESSAGE = "message"  # the message item's place among the outputs (calls: their items)


class Response:
    """What a response.create asked for, and how it ended; the shaper of its stream's
    frames (output_text deltas, then output_text.done in place of `done`)."""

    def __init__(self, event_id: str | None, conversation_id: str | None,
                 max_tokens: int, metadata: dict | None, tools: ToolPlan | None = None):
        self.id = new_id("resp")
        self.item_id = new_id("item")
        self.event_id = event_id
        self.conversation_id = conversation_id  # None: out-of-band
        self.max_tokens = max_tokens
        self.metadata = metadata
        self.client_cancelled = False
        self.error: dict | None = None  # {type, code, message} of a refusal or failure
        self.parser = tools.parser() if tools is not None else None
        self.text = ""  # with tools: the message item's text (what is not a call)
        self.fed = 0  # with tools: characters of the stream's text read so far
        self.outputs: list = [] if tools is not None else [_MESSAGE]
        self._tail: list[dict] | None = None  # with tools: the events `done` sends

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
        events = [server.event("response.created", response=self.body("in_progress")),
                  rate_limits]
        return events if self.parser is not None else events + self._message_opening()

    def messages(self, stream: Stream) -> list[tuple[str, dict]]:
        """(item id, chat message) of each output, in order, as the conversation keeps
        them (finish_items() called); none for an empty reply."""
        if self.parser is None:
            text = stream.text
            return [(self.item_id, {"role": "assistant", "content": text})] if text else []
        return [(self.item_id, {"role": "assistant", "content": self.text})
                if output is _MESSAGE else
                (output["id"], {"role": "assistant", "content": "", "tool_calls": [
                    ToolCall(output["name"], output["arguments"], output["call_id"]).openai()]})
                for output in self.outputs]

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
        items = self._items(stream, "completed" if status == "completed" else "incomplete")
        if self.parser is not None:
            events = [] if stream.finish_reason else self.done_frame(stream, 0.0)
        else:
            text, where = stream.text, {"response_id": self.id, "output_index": 0}
            events = [] if stream.finish_reason else [self.text_done(stream)]
            events += [server.event("response.content_part.done", **where,
                                    item_id=self.item_id, content_index=0,
                                    part={"type": "text", "text": text}),
                       server.event("response.output_item.done", **where, item=items[0])]
        if in_conversation:
            for item in items:
                events += [server.event(kind, item=item, previous_item_id=previous_item_id)
                           for kind in ("conversation.item.added", "conversation.item.done")]
                previous_item_id = item["id"]
        events.append(server.event("response.done", response=self.body(
            status, stream, details, items)))
        return events

    def _items(self, stream: Stream, status: str) -> list[dict]:
        text = stream.text if self.parser is None else self.text
        return [server.item(self.item_id, "assistant", text, status)
                if output is _MESSAGE else output for output in self.outputs]

    # -- Shaper: the frames of its stream -----------------------------------------------
    def delta_frame(self, stream: Stream, out: RequestOutput) -> dict | list[dict] | None:
        if self.parser is None:
            # Realtime text responses never ask for log-probabilities.
            return self._delta(out.delta_text)
        if self._tail is not None:
            return None  # the items are closed: `done` sends the rest
        return self._feed(stream)

    def done_frame(self, stream: Stream, now: float) -> dict | list[dict]:
        if self.parser is None:
            return self.text_done(stream)
        self.finish_items(stream)
        tail, self._tail = self._tail, []  # sent once
        return tail

    def text_done(self, stream: Stream) -> dict:
        return server.event("response.output_text.done", response_id=self.id,
                            item_id=self.item_id, output_index=0, content_index=0,
                            text=stream.text)

    # -- with tools ------------------------------------------------------------------------
    def finish_items(self, stream: Stream) -> None:
        """Read the rest of the text and close the message item, once: whichever comes
        first, the stream's `done` or the protocol (which needs the calls to keep them);
        the events wait for `done`."""
        if self.parser is None or self._tail is not None:
            return
        events = self._feed(stream) + self._read(*self.parser.finish())
        if _MESSAGE in self.outputs:
            index = self.outputs.index(_MESSAGE)
            where = {"response_id": self.id, "output_index": index}
            status = "completed" if stream.finish_reason == "stop" else "incomplete"
            events += [
                server.event("response.output_text.done", **where, item_id=self.item_id,
                             content_index=0, text=self.text),
                server.event("response.content_part.done", **where, item_id=self.item_id,
                             content_index=0, part={"type": "text", "text": self.text}),
                server.event("response.output_item.done", **where, item=server.item(
                    self.item_id, "assistant", self.text, status))]
        self._tail = events

    def _feed(self, stream: Stream) -> list[dict]:
        text, self.fed = stream.text[self.fed:], len(stream.text)
        return self._read(*self.parser.feed(text)) if text else []

    def _read(self, content: str, calls: list[ToolCall]) -> list[dict]:
        """Content into the message item (opened when it first appears), each call as a
        function_call item of its own, sent whole."""
        events = []
        if content:
            if _MESSAGE not in self.outputs:
                self.outputs.append(_MESSAGE)
                events += self._message_opening()
            self.text += content
            events.append(self._delta(content))
        for call in calls:
            item = server.function_call(new_id("item"), call.id, call.name, call.arguments)
            where = {"response_id": self.id, "output_index": len(self.outputs)}
            ids = {"item_id": item["id"], "call_id": call.id}
            self.outputs.append(item)
            events += function_call_events(server.event, item, where, ids)
        return events

    def _message_opening(self) -> list[dict]:
        where = {"response_id": self.id, "output_index": self.outputs.index(_MESSAGE)}
        return [server.event("response.output_item.added", **where,
                             item=server.item(self.item_id, "assistant", "", "in_progress")),
                server.event("response.content_part.added", **where, item_id=self.item_id,
                             content_index=0, part={"type": "text", "text": ""})]

    def _delta(self, text: str) -> dict:
        return server.event("response.output_text.delta", response_id=self.id,
                            item_id=self.item_id, output_index=self.outputs.index(_MESSAGE),
                            content_index=0, delta=text)
