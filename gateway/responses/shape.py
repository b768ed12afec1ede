"""One response's Response object and its stream events, as OpenAI shapes them.

    response.created, response.in_progress,
    response.output_item.added, response.content_part.added          opening()
    response.output_text.delta ...                                    feed()
    response.output_text.done, response.content_part.done,
    response.output_item.done,                                        closing_items()
    response.completed | response.incomplete | response.failed        end_event()

With tools, the text is read by the tool-call parser as it streams: content opens the
message item when it first appears, and each call is a `function_call` item of its own
(output_item.added, function_call_arguments.delta/.done, output_item.done).

`sequence_number` is given as each event is written (stamp()), so it counts the events
in the order the client receives them, whichever writer sends them (SSE or a socket).
"""
from __future__ import annotations

import time

from gateway.responses.request import CreateRequest
from gateway.responses.tools import call_item, tools_body
from gateway.responses.turn import new_id
from gateway.stream import Stream
from gateway.tools.events import function_call_events, plain_event
from gateway.tools.parser import ToolCall
from gateway.tools.plan import ToolPlan

_MESSAGE = "message"  # the message item's place among the output items

# finish_reason -> (status, incomplete_details.reason)
_STATUS = {"stop": ("completed", None), "length": ("incomplete", "max_output_tokens"),
           "cancelled": ("cancelled", None), "error": ("failed", None)}
_END_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete",
              "failed": "response.failed", "cancelled": "response.failed"}


class ResponseShape:
    """A response's identity and settings, the events of its run and its final object."""

    def __init__(self, req: CreateRequest, model: str, max_tokens: int,
                 stream_id: str | None = None, tools: ToolPlan | None = None):
        self.id = new_id("resp")
        self.item_id = new_id("msg")
        self.created_at = int(time.time())
        self.req = req
        self.model = model
        self.max_tokens = max_tokens
        self.stream_id = stream_id  # a WebSocket lane, echoed on its events
        self.sequence = 0
        self.error: dict | None = None  # {code, message} of a failure
        self.status = "in_progress"
        self.generate = True  # False: a prefill only, with no output item
        self.completed_at: int | None = None
        self.parser = tools.parser() if tools is not None else None
        self.text = ""  # the message item's text: with tools, what is not a call
        self.fed = 0  # characters of the stream's text read so far
        # output items in order: the message (no tools: always first) and function calls
        self.outputs: list = [] if tools is not None else [_MESSAGE]
        self._closing: list[dict] | None = None

    def stamp(self, event: dict) -> dict:
        """The event with the next sequence number (and the socket lane, if any)."""
        event["sequence_number"] = self.sequence
        self.sequence += 1
        if self.stream_id is not None:
            event["stream_id"] = self.stream_id
        return event

    # -- the Response object -------------------------------------------------------------
    def body(self, stream: Stream | None = None, output: list[dict] | None = None) -> dict:
        req = self.req
        fmt = req.text.format if req.text is not None and req.text.format else None
        text = {"format": _format_body(fmt) if fmt else {"type": "text"}}
        body = {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": self.status, "background": bool(req.background),
            "error": self.error, "incomplete_details": None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": None, "model": self.model, "output": output or [],
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id, "reasoning": None,
            "store": req.store is not False, "temperature": req.temperature,
            "text": text, "tool_choice": _choice_body(req.tool_choice), "tools": tools_body(req),
            "top_p": req.top_p, "truncation": req.truncation or "auto",
            "usage": None, "metadata": req.metadata or {}, "user": req.user,
        }
        if self.status not in ("in_progress", "queued"):
            body["completed_at"] = self.completed_at
        if stream is not None:
            body["usage"] = usage(stream)
            if self.status == "incomplete":
                body["incomplete_details"] = {"reason": "max_output_tokens"}
        return body

    def message(self, text: str, status: str) -> dict:
        return {"id": self.item_id, "type": "message", "role": "assistant", "status": status,
                "content": [] if status == "in_progress" and not text else
                [output_text(text)]}

    def finish(self, stream: Stream) -> None:
        """Set the status from how the stream ended."""
        self.status = _STATUS[stream.finish_reason or "error"][0]
        self.completed_at = int(time.time()) if self.status == "completed" else None
        if not self.generate and self.status == "incomplete":
            self.status = "completed"  # a prefill's one token is its whole job
        if self.status == "failed" and self.error is None:
            self.error = {"code": "server_error",
                          "message": stream.error or f"the response was {self.status}"}

    def final(self, stream: Stream) -> dict:
        """The finished Response object (finish() called)."""
        if not self.generate:
            return self.body(stream)
        self.closing_items(stream)  # every call read
        item_status = "completed" if self.status == "completed" else "incomplete"
        text = stream.text if self.parser is None else self.text
        return self.body(stream, [self.message(text, item_status) if o is _MESSAGE else o
                                  for o in self.outputs])

    @property
    def calls(self) -> list[ToolCall]:
        return self.parser.calls if self.parser is not None else []

    # -- events ----------------------------------------------------------------------------
    def opening(self) -> list[dict]:
        events = [{"type": "response.created", "response": self.body()},
                  {"type": "response.in_progress", "response": self.body()}]
        if not self.generate or self.parser is not None:
            return events
        return events + self._message_opening()

    def feed(self, text: str) -> list[dict]:
        """The events of the next piece of the stream's text."""
        self.fed += len(text)
        if self.parser is None:
            return [self._delta(text)]
        return self._read(*self.parser.feed(text))

    def closing_items(self, stream: Stream) -> list[dict]:
        """The events that close the output items (once: later calls repeat them)."""
        if self._closing is not None or not self.generate:
            return self._closing or []
        events = []
        if self.parser is not None:  # what was not fed (a whole answer: all of it)
            events = self.feed(stream.text[self.fed:])
            rest, calls = self.parser.finish()
            events += self._read(rest, calls)
        if _MESSAGE in self.outputs:
            text = stream.text if self.parser is None else self.text
            where = {"item_id": self.item_id, "output_index": self.outputs.index(_MESSAGE),
                     "content_index": 0}
            status = "completed" if stream.finish_reason == "stop" else "incomplete"
            events += [
                {"type": "response.output_text.done", **where, "text": text, "logprobs": []},
                {"type": "response.content_part.done", **where, "part": output_text(text)},
                {"type": "response.output_item.done", "output_index": where["output_index"],
                 "item": self.message(text, status)}]
        self._closing = events
        return events

    def end_event(self, stream: Stream) -> dict:
        return {"type": _END_EVENT[self.status], "response": self.final(stream)}

    def closing(self, stream: Stream) -> list[dict]:
        return self.closing_items(stream) + [self.end_event(stream)]

    def _message_opening(self) -> list[dict]:
        where = {"output_index": self.outputs.index(_MESSAGE)}
        return [{"type": "response.output_item.added", **where,
                 "item": self.message("", "in_progress")},
                {"type": "response.content_part.added", **where, "item_id": self.item_id,
                 "content_index": 0, "part": output_text("")}]

    def _delta(self, text: str) -> dict:
        return {"type": "response.output_text.delta", "item_id": self.item_id,
                "output_index": self.outputs.index(_MESSAGE), "content_index": 0,
                "delta": text, "logprobs": []}

    def _read(self, content: str, calls: list[ToolCall]) -> list[dict]:
        """Content into the message item (opened when it first appears), each call as a
        function_call item of its own."""
        events = []
        if content:
            if _MESSAGE not in self.outputs:
                self.outputs.append(_MESSAGE)
                events += self._message_opening()
            self.text += content
            events.append(self._delta(content))
        for call in calls:
            item = call_item(call, new_id("fc"))
            where = {"output_index": len(self.outputs)}
            self.outputs.append(item)
            events += function_call_events(plain_event, item, where, {"item_id": item["id"]})
        return events


def _choice_body(choice) -> str | dict:
    if isinstance(choice, dict) and "function" in choice:
        return {"type": "function", "name": choice["function"].get("name")}
    return choice or "auto"


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def usage(stream: Stream) -> dict:
    return {"input_tokens": stream.prompt_tokens,
            "input_tokens_details": {"cached_tokens": stream.cached_tokens,
                                     "cache_write_tokens": 0},
            "output_tokens": stream.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": stream.prompt_tokens + stream.completion_tokens}


def _format_body(fmt) -> dict:
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    body = {"type": "json_schema", "name": fmt.name, "schema": fmt.schema or {}}
    if fmt.description is not None:
        body["description"] = fmt.description
    if fmt.strict is not None:
        body["strict"] = fmt.strict
    return body
