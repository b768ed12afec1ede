"""Connection: one WebSocket's reader, request tasks and writer.

The handler task is the only caller of `receive()` (it iterates the socket); each chat or
generate runs as its own task that feeds the Outbox; one writer task writes frames.
Closing the socket cancels the request tasks, which closes their engine generators and
so aborts the requests (KV blocks freed) before the cancellation re-raises.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time

from aiohttp import WSMsgType, web

from engine.errors import EngineError
from gateway import protocol as p
from gateway.logprobs_format import token_strings, ws_entries
from gateway.outbox import CLOSE_SLOW_CONSUMER, Outbox, OutboxFull, run_writer
from gateway.params import build_params
from gateway.sessions import LiveSession
from gateway.state import Runtime
from gateway.stream import Stream

log = logging.getLogger(__name__)
_conn_ids = itertools.count()


class Connection:
    """A socket attached to a session; `serve()` runs until the socket closes."""

    def __init__(self, rt: Runtime, ws: web.WebSocketResponse, codec: p.Codec,
                 session: LiveSession, resumed: bool):
        self.rt = rt
        self.ws = ws
        self.codec = codec
        self.session = session
        self.resumed = resumed
        self.tag = f"ws{next(_conn_ids)}"
        self.streams: dict[str, Stream] = {}
        self.outbox = Outbox(rt.config.max_pending_frames)
        self._engine_ids = itertools.count()
        self._background: set[asyncio.Task] = set()
        self._handlers = {p.Chat: self._on_chat, p.Generate: self._on_generate,
                          p.Cancel: self._on_cancel, p.SessionUpdate: self._on_session_update,
                          p.Ping: self._on_ping}

    # -- the socket's lifetime -----------------------------------------------------------
    async def serve(self) -> None:
        writer = asyncio.create_task(run_writer(
            self.ws, self.codec, self.outbox, self.rt.metrics, self.rt.config.send_timeout_s,
            self._on_stuck))
        self.outbox.put(self._hello())
        try:
            await self._read_loop()
        finally:
            # The handler may be cancelled (again) while it waits for the aborts when the
            # peer vanishes (handler_cancellation): the writer must be cancelled anyway.
            try:
                await self._abort_all()
            finally:
                self.outbox.close()
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer

    async def _read_loop(self) -> None:
        try:
            async for msg in self.ws:
                if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    self._handle(msg.data)
                elif msg.type == WSMsgType.ERROR:
                    break
        except asyncio.TimeoutError:  # receive_timeout: the client went quiet
            await self.ws.close(code=1000, message=b"receive timeout")
        except OutboxFull:
            await self.ws.close(code=CLOSE_SLOW_CONSUMER, message=b"client is not reading")

    async def _abort_all(self) -> None:
        tasks = [s.task for s in self.streams.values() if s.task is not None]
        for task in tasks:
            task.cancel()  # cancel_requested stays False: the cancellation re-raises
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coro) -> None:
        """Run coro beside the socket's tasks, holding a reference until it ends: the event
        loop keeps only weak ones, so an unreferenced task can be collected mid-run."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _on_stuck(self) -> None:
        self._spawn(self._close_stuck())

    async def _close_stuck(self) -> None:
        """Offer a close frame for a second, then drop the connection whatever happened:
        a graceful close waits forever for a peer that does not read, and ws.close() can
        also end cancelled (when the reader sees the close first), not only time out."""
        try:
            await asyncio.wait_for(self.ws.close(code=CLOSE_SLOW_CONSUMER,
                                                 message=b"send timeout"), 1.0)
        except (asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            self._drop()

    def _drop(self) -> None:
        transport = self.ws._req.transport if self.ws._req else None  # noqa: SLF001
        if transport is not None:
            transport.abort()

    def notify(self, frame: dict) -> None:
        """Queue a frame the server sends on its own (`draining`). A socket whose outbox
        is full is not reading: it is closed, as one that does not drain, and the caller
        goes on."""
        try:
            self.outbox.put(frame)
        except OutboxFull:
            log.warning("socket %s is not reading its frames; closing it", self.tag)
            self._on_stuck()

    async def close(self, code: int, message: bytes, timeout: float) -> None:
        """Close after the frames already queued are written (drain, shutdown); a peer
        that has not read them and answered the close within `timeout` is dropped."""
        try:
            await asyncio.wait_for(self._flush_then_close(code, message), timeout)
        except (asyncio.TimeoutError, ConnectionError):
            self._drop()

    async def _flush_then_close(self, code: int, message: bytes) -> None:
        while not self.outbox.empty:
            await asyncio.sleep(0.02)
        await self.ws.close(code=code, message=message)

    def _hello(self) -> dict:
        engine = self.rt.engine
        return {"type": "hello", "protocol": p.PROTOCOL, "session_id": self.session.id,
                "resumed": self.resumed, "model": engine.model_name,
                "instance": self.rt.config.instance_id,
                "limits": self.rt.config.limits(engine.max_model_len)}

    # -- client messages -----------------------------------------------------------------
    def _handle(self, data: bytes | str) -> None:
        msg = None
        try:
            if self.codec.binary and isinstance(data, str):
                raise p.ProtocolError("invalid_json", "this socket speaks msgpack: send "
                                      "binary frames")
            msg = self.codec.decode(data)
            if isinstance(msg, p.Bare):
                self._on_bare(msg)
            else:
                self._handlers[type(msg)](msg)
        except p.ProtocolError as exc:
            self.outbox.put(exc.frame())
        except OutboxFull:
            raise  # the reader closes the socket: its client is not reading
        except Exception:  # noqa: BLE001 - one frame's fault must not close the socket
            request_id = getattr(msg, "id", None)
            log.exception("frame %r on %s failed", request_id, self.tag)
            self.outbox.put(p.ProtocolError("internal", "internal error", request_id).frame())

    def _check_new(self, request_id: str) -> None:
        if self.rt.status == "draining":
            raise p.ProtocolError("draining", "the server is shutting down; reconnect later",
                                  request_id)
        if request_id in self.streams:
            raise p.ProtocolError("duplicate_id", f"id: {request_id!r} is already running",
                                  request_id)

    def _on_chat(self, msg: p.Chat) -> None:
        self._check_new(msg.id)
        if self.session.active_turn is not None:
            raise p.ProtocolError("busy", f"chat turn {self.session.active_turn!r} is still "
                                  "running in this session", msg.id)
        params = build_params(self.rt.config, self.session.record.params, msg.params,
                              request_id=msg.id)
        self.session.record.messages.append({"role": "user", "content": msg.content})
        self.session.active_turn = msg.id
        stream = self._start(msg.id, "chat")
        self._launch(stream, self._run_chat(stream, params))

    def _on_generate(self, msg: p.Generate) -> None:
        self._check_new(msg.id)
        params = build_params(self.rt.config, msg.params, request_id=msg.id)
        if msg.messages is not None:
            prompt = [p.message_dict(i, m.role, m.content) for i, m in enumerate(msg.messages)]
        else:
            prompt = msg.prompt
        stream = self._start(msg.id, "generate")
        self._launch(stream, self._run_generate(stream, prompt, params))

    def _start(self, request_id: str, kind: str) -> Stream:
        stream = Stream(request_id, f"{self.tag}-{next(self._engine_ids)}", kind)
        self.streams[request_id] = stream
        return stream

    def _launch(self, stream: Stream, coro) -> None:
        stream.task = asyncio.create_task(coro)
        stream.task.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task) -> None:
        """The last boundary of a request task: `_run` answers the request's own faults,
        so what escapes came after its reply (a full outbox, a failed cleanup)."""
        if task.cancelled() or task.exception() is None:
            return
        if isinstance(task.exception(), OutboxFull):
            self._on_stuck()  # the client is not reading: close it as the reader would
            return
        log.error("request task on %s failed after its reply", self.tag,
                  exc_info=task.exception())

    def _on_cancel(self, msg: p.Cancel) -> None:
        stream = self.streams.get(msg.id)
        if stream is None:
            raise p.ProtocolError("not_found", f"id: no running request {msg.id!r}", msg.id)
        stream.cancel_requested = True
        stream.task.cancel()

    def _on_session_update(self, msg: p.SessionUpdate) -> None:
        record = self.session.record
        if msg.params is not None:
            build_params(self.rt.config, msg.params)  # refuse bad defaults now, not per turn
            record.params = dict(msg.params)
        if msg.system is not None:
            record.system = msg.system or None
        self._save_then_reply()

    def _on_bare(self, msg: p.Bare) -> None:
        if msg.type == "session.history":
            self.outbox.put({"type": "session.history", "session_id": self.session.id,
                             "system": self.session.record.system,
                             "messages": list(self.session.record.messages)})
            return
        if self.session.active_turn is not None:
            raise p.ProtocolError("busy", "a chat turn is running; cancel it first")
        self.session.record.messages.clear()
        self._save_then_reply()

    def _on_ping(self, msg: p.Ping) -> None:
        self.outbox.put({"type": "pong", "t": msg.t})

    def _save_then_reply(self) -> None:
        record = self.session.record
        reply = {"type": "session.updated", "session_id": record.session_id,
                 "system": record.system, "params": record.params,
                 "history_length": len(record.messages)}
        self._spawn(self._save(reply))

    async def _save(self, reply: dict | None = None, request_id: str | None = None) -> bool:
        error = await self.rt.sessions.save(self.session)
        if error is not None:
            retry_ms = getattr(error, "retry_after_ms", None)
            self.outbox.put(p.ProtocolError(error.code, str(error), request_id, retry_ms).frame())
        elif reply is not None:
            self.outbox.put(reply)
        return error is None

    # -- request tasks -------------------------------------------------------------------
    async def _run_chat(self, stream: Stream, params) -> None:
        """A chat turn. The accepted user turn is saved before the prompt is rendered, and
        the finished turn before its `done` goes out, so a client that saw `done` finds
        the turn again even after a hard kill of the server."""
        started = ended = False

        async def render(_stream: Stream, max_tokens: int) -> list[int] | None:
            nonlocal started
            started = await self._save(request_id=stream.id)
            return self._chat_prompt(max_tokens) if started else None

        async def end_turn(_stream: Stream) -> None:
            nonlocal ended
            ended = True
            self.session.end_turn(stream.text)
            await asyncio.shield(self._save(request_id=stream.id))

        try:
            await self._run(stream, render, params, before_done=end_turn)
        finally:
            if started and not ended:  # cancelled, failed or refused: close it all the same
                await end_turn(stream)
            elif not started:  # its save was refused (and answered): nothing to undo
                self.session.end_turn("")

    def _chat_prompt(self, max_tokens: int) -> list[int]:
        """The session's chat rendered, oldest turns dropped until it leaves room for the
        reply."""
        engine = self.rt.engine
        messages = self.session.chat_messages()
        first = 1 if self.session.record.system else 0
        prompt = engine.encode_chat(messages)
        while len(prompt) + max_tokens > engine.max_model_len and len(messages) - first > 1:
            del messages[first:first + 2]  # one user turn and its reply
            prompt = engine.encode_chat(messages)
        return prompt

    async def _run_generate(self, stream: Stream, prompt, params) -> None:
        async def render(_stream: Stream, _max_tokens: int) -> list[int]:
            if isinstance(prompt, str):
                return self.rt.engine.encode(prompt)
            if prompt and isinstance(prompt[0], dict):
                return self.rt.engine.encode_chat(prompt)
            return prompt

        await self._run(stream, render, params)

    async def _run(self, stream: Stream, render, params, before_done=None) -> None:
        """Render the prompt to token ids, admit (the scheduler weighs its length and the
        caller's key), stream engine outputs into the outbox, await `before_done` (if any),
        then `done` (or one `error`)."""
        ticket = None
        try:
            prompt = await render(stream, params.max_tokens)
            if prompt is None:
                return
            ticket = await self.rt.gate.admit(stream.id, self, stream.kind,
                                              params.priority, len(prompt),
                                              self.session.record.owner,
                                              received=stream.received)
            stream.admitted = time.perf_counter()
            if params.logprobs is not None:
                stream.logprob_entries = functools.partial(
                    ws_entries, text=token_strings(self.rt.engine.tokenizer))
            generator = self.rt.engine.generate(prompt, params, stream.engine_id)
            async with contextlib.aclosing(generator) as outputs:
                async for out in outputs:
                    stream.absorb(out)
                    self.outbox.put_delta(stream)
            if before_done is not None:
                await before_done(stream)
            self.outbox.put_done(stream)
        except asyncio.CancelledError:
            if not stream.cancel_requested:
                raise  # the socket closed: nothing to tell, the generator already aborted
            asyncio.current_task().uncancel()
            stream.finish_reason = "cancelled"
            self.outbox.put_done(stream)
        except p.ProtocolError as exc:
            self.put_error(exc)
        except Exception as exc:  # noqa: BLE001 - a request's failure must not kill the socket
            self._request_failed(stream, exc)
        finally:
            if ticket is not None:
                ticket.release(stream.completion_tokens, stream.finish_reason)
            self.streams.pop(stream.id, None)

    def put_error(self, exc: p.ProtocolError) -> None:
        """Queue the error frame of a refused request (other protocols shape it their way)."""
        self.outbox.put(exc.frame())

    def _request_failed(self, stream: Stream, exc: Exception) -> None:
        code = exc.code if isinstance(exc, EngineError) else "internal"
        if code == "internal":
            log.error("request %s failed", stream.engine_id, exc_info=exc)
        if stream.first_written is None and not stream.queued:
            message = str(exc) if code != "internal" else "internal error"
            self.put_error(p.ProtocolError(code, message, stream.id))
            return
        stream.finish_reason, stream.error = "error", "internal error"
        self.outbox.put_done(stream)
