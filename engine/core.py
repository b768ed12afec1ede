"""EngineCore: requests in, one batch of RequestOutputs per step out. Single-threaded.

Each step's forward pass (the model and its sampler) runs as one turn at the engine's
DeviceGate party, so engines of several models in one process take the device in fair
turns (engine/device_gate.py); scheduling and booking the outputs run outside it."""
from __future__ import annotations

import logging

from jinja2 import TemplateError

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.device_gate import DeviceGate, GateParty
from engine.errors import EngineDeadError, InvalidRequestError, PromptTooLongError
from engine.grammar import GrammarCompiler, new_matcher
from engine.host_memory import keep_freed_step_buffers
from engine.kv_tiers import KVTiers, build_kv_tiers
from engine.loader import load_model
from engine.model_runner import ModelRunner
from engine.models.config import context_len
from engine.outputs import EngineStats, RequestOutput, SampledToken
from engine.prompt_length import max_chars_per_token
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.speculative import NgramProposer
from engine.step_scheduler import ScheduledBatch, StepScheduler
from engine.tokenizer_process import TokenizerProcess

log = logging.getLogger(__name__)

_MAX_CONTEXT = 32768


class EngineCore:
    """The model side of tokenwire: step scheduler, block manager, runner, detokenizers."""

    def __init__(self, config: EngineConfig, gate: GateParty | None = None):
        """`gate`: this engine's party at the device gate it shares with other engines
        (None: a gate of its own, never waited at)."""
        self.config = config
        self.gate = gate or DeviceGate().party()
        loaded = load_model(config.model, config.resolved_device(), config.resolved_dtype(),
                            config.seed, config.quantization,
                            tokenizer_process=config.tokenizer_process == "on")
        self.tokenizer = loaded.tokenizer
        self.model_config = loaded.config
        self.model_name = loaded.name
        self.eos_token_ids = frozenset(loaded.config.eos_token_ids)
        self.vocab_size = loaded.config.vocab_size
        wanted_len = context_len(loaded.config, config.max_model_len, _MAX_CONTEXT)
        self.runner = ModelRunner(config, loaded, wanted_len)
        if self.runner.device.type == "cpu":
            keep_freed_step_buffers()
        pool_tokens = self.runner.num_blocks * config.block_size
        self.max_model_len = min(wanted_len, pool_tokens)
        # engine.prompt_length's bound (None: none holds), worked out while loading, not on
        # the first prompt: a tokenizer built here decodes its whole vocabulary for it.
        self.max_chars_per_token = (
            self.tokenizer.max_chars_per_token if isinstance(self.tokenizer, TokenizerProcess)
            else max_chars_per_token(self.tokenizer))
        self.kv_tiers: KVTiers | None = build_kv_tiers(config, self.runner, loaded)
        self.blocks = BlockManager(self.runner.num_blocks, config.block_size,
                                   config.enable_prefix_caching, self.kv_tiers)
        self.step_scheduler = StepScheduler(self.blocks, config.max_num_seqs,
                                            config.max_num_batched_tokens,
                                            eos_token_ids=self.eos_token_ids,
                                            max_model_len=self.max_model_len,
                                            proposer=proposer_for(config),
                                            spec_max_rows=config.speculative_max_rows,
                                            tier_load_cost=config.kv_tier_load_cost)
        self.grammars = GrammarCompiler(
            self.tokenizer, self.runner.sample_vocab, self.eos_token_ids,
            threads=config.grammar_compile_threads, cache_size=config.grammar_cache_size,
            timeout_s=config.grammar_compile_timeout_s,
            max_number_digits=config.max_json_number_digits)
        self.requests: dict[str, Request] = {}
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        self.pending: list[RequestOutput] = []
        self.totals = EngineStats()
        self.num_failed_steps = 0  # in a row; reset by every step that succeeds

    # -- text ------------------------------------------------------------------------
    def close_tokenizer(self) -> None:
        """End the tokenizer's child process, where it has one (engine.tokenizer_process)."""
        if isinstance(self.tokenizer, TokenizerProcess):
            self.tokenizer.close()

    def encode(self, text: str) -> list[int]:
        self._check_length(text)
        return self.tokenizer.encode(text)

    def _check_length(self, text: str) -> None:
        """PromptTooLongError for a text that cannot fit whatever its tokens, before the
        cost of encoding it (engine.prompt_length)."""
        per_token = self.max_chars_per_token
        if per_token is not None and len(text) > per_token * self.max_model_len:
            raise PromptTooLongError(
                f"prompt has {len(text)} characters, more than {self.max_model_len} tokens "
                f"of at most {per_token} characters each; the context holds "
                f"{self.max_model_len} including at least one generated token")

    @property
    def chat_template_supports_tools(self) -> bool:
        """Whether the chat template renders `tools` (a template without them ignores them)."""
        return "tools" in (self.tokenizer.chat_template or "")

    def encode_chat(self, messages, tools: list[dict] | None = None, *,
                    add_generation_prompt: bool = True, continue_final_message: bool = False,
                    template_kwargs: dict | None = None) -> list[int]:
        """The tokenizer's chat template with the assistant's generation prompt (or the
        last message left open to be continued), the tools rendered by the template when
        given, and the caller's extra template variables. A template that refuses the
        conversation (its `raise_exception`, an unfinished final message to continue) is
        an InvalidRequestError on `messages`."""
        try:
            text = self.tokenizer.apply_chat_template(
                list(messages), tools=tools, tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, **(template_kwargs or {}))
        except (TemplateError, ValueError) as exc:
            raise InvalidRequestError("messages", f"the chat template refused them: "
                                      f"{str(exc)[:200]}") from None
        self._check_length(text)
        return self.tokenizer.encode(text, add_special_tokens=False)

    # -- requests --------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise InvalidRequestError/PromptTooLongError for a request that cannot run."""
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params", "must be SamplingParams")
        if not prompt_token_ids:
            raise InvalidRequestError("prompt", "must not be empty")
        if any(not isinstance(t, int) or not 0 <= t < self.vocab_size for t in prompt_token_ids):
            raise InvalidRequestError("prompt", f"token ids must be in [0, {self.vocab_size})")
        if params.logprobs is not None and params.logprobs > self.config.max_logprobs:
            raise InvalidRequestError("logprobs", f"must be at most {self.config.max_logprobs}")
        if len(prompt_token_ids) >= self.max_model_len:
            raise PromptTooLongError(
                f"prompt has {len(prompt_token_ids)} tokens; the context holds "
                f"{self.max_model_len} including at least one generated token")

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams, parent_id: str | None = None,
                    grammar=None) -> None:
        """Queue a request. It trusts its caller to have checked the request with
        `validate`, as the public entries (AsyncEngine.generate, LLM.generate) each do
        once. `parent_id` names another sample of the same prompt (`n > 1`): while that one
        lives, this one shares its prompt's KV blocks instead of a prefill. `grammar`: the
        compiled response_format (AsyncEngine compiles it off this thread); compiled here,
        blocking, when a constrained request comes without one."""
        if request_id in self.requests:
            raise InvalidRequestError("id", f"request {request_id!r} is already running")
        request = Request(request_id, list(prompt_token_ids), params)
        parent = self.requests.get(parent_id) if parent_id is not None else None
        if parent is not None and parent.prompt_token_ids != request.prompt_token_ids:
            parent = None
        if params.response_format is not None:
            request.grammar = new_matcher(grammar or self.grammars.compile(params.response_format))
        self.requests[request_id] = request
        self.detokenizers[request_id] = IncrementalDetokenizer(
            self.tokenizer, request.prompt_token_ids, params.stop, params.skip_special_tokens)
        self.step_scheduler.add(request, parent)
        self.totals.prompt_tokens += request.num_prompt_tokens

    def abort_request(self, request_id: str) -> None:
        """End a request now; its final output (cancelled) comes with the next step."""
        request = self.requests.get(request_id)
        if request is not None:
            self.pending.append(self._finish(request, "cancelled", ""))

    def has_work(self) -> bool:
        return bool(self.pending) or self.step_scheduler.has_work()

    # -- the step --------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """schedule -> execute -> update_from_output. A step that raises ends the requests
        it held with `error` (blocks freed); the others go on. Raises EngineDeadError after
        max_consecutive_failed_steps failed steps in a row."""
        outputs, self.pending = self.pending, []
        batch = self.step_scheduler.schedule()
        if not batch.requests:
            return outputs
        try:
            with self.gate.turn():
                sampled = self.runner.execute(batch)
            booked = self.step_scheduler.update_from_output(batch, sampled)
        except Exception as exc:  # noqa: BLE001 - the fault ends at this step's requests
            return outputs + self._fail_step(batch, exc)
        self.num_failed_steps = 0
        self.totals.steps += 1
        self.totals.generation_tokens += sum(len(samples) for _, samples in booked)
        outputs.extend(self._on_tokens(request, samples) for request, samples in booked)
        return outputs

    def _fail_step(self, batch: ScheduledBatch, exc: Exception) -> list[RequestOutput]:
        self.num_failed_steps += 1
        log.error("engine step failed (%d in a row); ending its %d requests",
                  self.num_failed_steps, len(batch.requests), exc_info=exc)
        error = f"engine step failed: {type(exc).__name__}: {exc}"
        failed = [self._finish(r, "error", "", error=error) for r in batch.requests
                  if r.request_id in self.requests]
        if self.num_failed_steps >= self.config.max_consecutive_failed_steps:
            raise EngineDeadError(f"{self.num_failed_steps} engine steps failed in a row; "
                                  f"the last: {type(exc).__name__}: {exc}") from exc
        return failed

    def _on_tokens(self, request: Request, samples: list[SampledToken]) -> RequestOutput:
        try:
            out = self._detokenize(request, [s.token_id for s in samples],
                                   request.finish_reason)
        except Exception as exc:  # one request's failure must not stop the others
            log.exception("request %s failed", request.request_id)
            return self._finish(request, "error", "", error=f"{type(exc).__name__}: {exc}")
        if samples[0].logprob is not None:
            out.logprobs = [s.logprob for s in samples[:len(out.new_token_ids)]]
        return out

    def _detokenize(self, request: Request, tokens: list[int], reason: str | None
                    ) -> RequestOutput:
        """The tokens' text, checked for stop strings; `reason` is the scheduler's stop,
        which only the last token can have caused. A stop string ends the request at the
        token that completes it: tokens after it (accepted proposals) are dropped."""
        detok = self.detokenizers[request.request_id]
        for count, token in enumerate(tokens, 1):
            if count == len(tokens) and reason == "stop":
                break  # a stop token's own text is never shown
            detok.add(token)
            if detok.stopped:
                self._drop_output(request, len(tokens) - count)
                tokens, reason = tokens[:count], "stop"
                break
        if reason is None:
            return self._output(request, detok.take_delta(final=False), tokens)
        detok.flush()
        return self._finish(request, reason, detok.take_delta(final=True), tokens)

    def _drop_output(self, request: Request, num_tokens: int) -> None:
        """Forget the request's last output tokens (booked, never shown)."""
        if num_tokens:
            del request.all_token_ids[-num_tokens:]
            self.totals.generation_tokens -= num_tokens

    def _finish(self, request: Request, reason: str, delta: str, new_tokens=(),
                error: str | None = None) -> RequestOutput:
        """Free the request everywhere (the scheduler may have finished it already) and
        build its final output."""
        self.step_scheduler.finish(request, reason)
        del self.requests[request.request_id]
        del self.detokenizers[request.request_id]
        self.runner.sampler.forget(request.request_id)
        counts = self.totals.finish_reasons
        counts[reason] = counts.get(reason, 0) + 1
        out = self._output(request, delta, list(new_tokens))
        out.finished, out.finish_reason, out.error = True, reason, error
        return out

    def _output(self, request: Request, delta: str, new_tokens: list[int]) -> RequestOutput:
        return RequestOutput(
            request.request_id, delta, new_tokens,
            num_prompt_tokens=request.num_prompt_tokens,
            num_cached_tokens=request.num_cached_tokens,
            num_output_tokens=request.num_output_tokens)

    def stats(self) -> EngineStats:
        t, sched = self.totals, self.step_scheduler
        return EngineStats(
            num_running=len(sched.running),
            num_waiting=len(sched.waiting) + len(sched.forks),
            num_free_blocks=self.blocks.num_free_blocks, num_total_blocks=self.blocks.num_blocks,
            prefix_cache_queries=self.blocks.cache_queries,
            prefix_cache_hits=self.blocks.cache_hits,
            prefill_tokens=sched.num_prefill_tokens,
            fork_shared_tokens=self.blocks.fork_shared_tokens,
            num_preemptions=sched.num_preemptions, prompt_tokens=t.prompt_tokens,
            generation_tokens=t.generation_tokens, steps=t.steps,
            spec_proposed_tokens=sched.num_spec_proposed,
            spec_accepted_tokens=sched.num_spec_accepted,
            spec_draft_steps=sched.num_spec_drafts,
            finish_reasons=dict(t.finish_reasons),
            kv_tiers={} if self.kv_tiers is None else self.kv_tiers.stats())


def proposer_for(config: EngineConfig) -> NgramProposer | None:
    """The speculative decoding proposer the config asks for, or None (off)."""
    if config.speculative is None:
        return None
    return NgramProposer(config.num_speculative_tokens, min_n=config.speculative_ngram_min,
                         max_n=config.speculative_ngram_max,
                         history_tokens=config.speculative_history_tokens)
