"""RequestRecord: what the client saw of one request. Filled by the clients, read by metrics."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestRecord:
    """One request's client-side trace. Times are seconds on `time.perf_counter()`.

    output_tokens prefers the server's usage count and falls back to the client's own
    (sum of delta `n`, or one per non-empty SSE chunk): see `finish()`.
    """

    prompt_len: int
    expected_output_len: int | None = None
    session: int | None = None
    turn: int | None = None
    model: str | None = None  # the model the request named (a model mix), else None
    start: float = 0.0
    ttft: float | None = None  # seconds from send to the first delta
    latency: float | None = None  # seconds from send to done
    chunk_times: list[float] = field(default_factory=list)  # arrival of each delta
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each delta
    text: str = ""
    success: bool = False
    finish_reason: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    usage_cached_tokens: int | None = None
    server_ttft_ms: float | None = None
    server_queue_ms: float | None = None
    retries: int = 0  # times the turn was sent again after `draining` or a lost socket
    reconnects: int = 0  # sockets the session reopened before or during this turn

    def add_chunk(self, now: float, text: str, num_tokens: int) -> None:
        """A delta arrived at `now` carrying `text` and `num_tokens` tokens."""
        if self.ttft is None:
            self.ttft = now - self.start
        self.chunk_times.append(now)
        self.chunk_tokens.append(num_tokens)
        self.text += text

    def finish(self, now: float, finish_reason: str | None) -> None:
        """The request ended normally (done frame, or the end of the SSE stream)."""
        self.latency = now - self.start
        self.finish_reason = finish_reason
        self.success = finish_reason not in ("error", "cancelled")
        if self.success and self.ttft is None:
            self.ttft = self.latency  # nothing streamed: the answer came in one piece

    def retry(self) -> None:
        """Forget the failed attempt: the next one is measured from its own send."""
        self.ttft = self.latency = self.finish_reason = None
        self.error_code = self.error_message = None
        self.chunk_times, self.chunk_tokens, self.text = [], [], ""
        self.success = False
        self.retries += 1

    def fail(self, code: str, message: str = "") -> None:
        """The request was refused or broke; `code` is the protocol's error code."""
        self.success = False
        self.error_code = code
        self.error_message = message[:200]

    @property
    def prompt_tokens(self) -> int:
        """The server's count of the prompt (history and template included) when it gave one."""
        if self.usage_prompt_tokens is not None:
            return self.usage_prompt_tokens
        return self.prompt_len

    @property
    def client_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def num_deltas(self) -> int:
        return len(self.chunk_times)

    @property
    def output_tokens(self) -> int:
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return self.client_tokens

    @property
    def itl(self) -> list[float]:
        """Gaps between consecutive deltas (vLLM's per-chunk inter-token latency)."""
        times = self.chunk_times
        return [b - a for a, b in zip(times, times[1:])]
