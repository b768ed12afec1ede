"""One response's Response object and its stream events, as OpenAI shapes them.

    response.created, response.in_progress,
    response.output_item.added, response.content_part.added          opening()
    response.output_text.delta ...                                    delta()
    response.output_text.done, response.content_part.done,
    response.output_item.done,
    response.completed | response.incomplete | response.failed        closing()

`sequence_number` is given as each event is written (stamp()), so it counts the events
in the order the client receives them, whichever writer sends them (SSE or a socket).
"""
from __future__ import annotations

import time

from gateway.responses.request import CreateRequest
from gateway.responses.turn import new_id
from gateway.stream import Stream

# finish_reason -> (status, incomplete_details.reason)
_STATUS = {"stop": ("completed", None), "length": ("incomplete", "max_output_tokens"),
           "cancelled": ("cancelled", None), "error": ("failed", None)}
_END_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete",
              "failed": "response.failed", "cancelled": "response.failed"}


class ResponseShape:
    """A response's identity and settings, the events of its run and its final object."""

    def __init__(self, req: CreateRequest, model: str, max_tokens: int,
                 stream_id: str | None = None):
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
            "text": text, "tool_choice": req.tool_choice or "auto", "tools": [],
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
        item_status = "completed" if self.status == "completed" else "incomplete"
        return self.body(stream, [self.message(stream.text, item_status)])

    # -- events ----------------------------------------------------------------------------
    def opening(self) -> list[dict]:
        where = {"output_index": 0}
        events = [{"type": "response.created", "response": self.body()},
                  {"type": "response.in_progress", "response": self.body()}]
        if not self.generate:
            return events
        return events + [
                {"type": "response.output_item.added", **where,
                 "item": self.message("", "in_progress")},
                {"type": "response.content_part.added", **where, "item_id": self.item_id,
                 "content_index": 0, "part": output_text("")}]

    def delta(self, text: str) -> dict:
        return {"type": "response.output_text.delta", "item_id": self.item_id,
                "output_index": 0, "content_index": 0, "delta": text, "logprobs": []}

    def closing(self, stream: Stream) -> list[dict]:
        final = self.final(stream)
        if not self.generate:
            return [{"type": _END_EVENT[self.status], "response": final}]
        text = stream.text
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        return [{"type": "response.output_text.done", **where, "text": text, "logprobs": []},
                {"type": "response.content_part.done", **where, "part": output_text(text)},
                {"type": "response.output_item.done", "output_index": 0,
                 "item": final["output"][0]},
                {"type": _END_EVENT[self.status], "response": final}]


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
