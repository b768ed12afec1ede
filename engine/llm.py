"""LLM: the offline API. Submit every prompt, step until all are done."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from tqdm import tqdm

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.errors import ConfigError
from engine.outputs import CompletionOutput
from engine.sampling_params import SamplingParams


def set_num_threads(num_threads: int | None) -> None:
    """torch's CPU intra-op threads: a setting of the whole process, so only entry points
    (`LLM`, `tokenwire serve`, `tokenwire bench`) call this. None keeps torch's default."""
    if num_threads is None:
        return
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads <= 0:
        raise ConfigError("num_threads", "must be a positive integer")
    torch.set_num_threads(num_threads)


class LLM:
    """Offline batched generation over the same engine the server uses.

    >>> llm = LLM(model="default", device="cpu")
    >>> llm.generate(["Hi"], SamplingParams(max_tokens=8, temperature=0))[0].text

    LLM is the Python API's entry point, so it is where `num_threads` (torch's CPU
    intra-op threads, a setting of the whole process) is applied; the engine itself never
    sets process-wide state (an application embedding AsyncEngine sets its own threads).
    """

    def __init__(self, model: str = "default", device: str = "auto",
                 num_threads: int | None = None, **config):
        set_num_threads(num_threads)
        self.core = EngineCore(EngineConfig(model=model, device=device, **config))

    @property
    def tokenizer(self):
        return self.core.tokenizer

    @property
    def engine_config(self) -> EngineConfig:
        return self.core.config

    @property
    def model_config(self):
        """The model's shape (engine.models.config.ModelConfig)."""
        return self.core.model_config

    def generate(self, prompts: Sequence[str] | Sequence[list[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[CompletionOutput]:
        """One output per prompt, in order. `params` may be one for all or one per prompt."""
        params = params or SamplingParams()
        per_prompt = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        results = self._add_requests(prompts, per_prompt)
        with tqdm(total=len(prompts), disable=not use_tqdm, desc="generate") as bar:
            while self.core.has_work():
                for out in self.core.step():
                    result = results[out.request_id]
                    result.text += out.delta_text
                    result.token_ids.extend(out.new_token_ids)
                    if out.logprobs:
                        result.logprobs = (result.logprobs or []) + out.logprobs
                    result.num_cached_tokens = out.num_cached_tokens
                    if out.finished:
                        result.finish_reason = out.finish_reason
                        bar.update(1)
        return list(results.values())

    def _add_requests(self, prompts, per_prompt: list[SamplingParams]
                      ) -> dict[str, CompletionOutput]:
        """Validate every prompt, then queue them all (a bad one raises before any is
        queued, so no request is left behind in the engine); an empty result for each."""
        token_ids = [self.core.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        for tokens, p in zip(token_ids, per_prompt):
            self.core.validate(tokens, p)
        results = {}
        for i, (tokens, p) in enumerate(zip(token_ids, per_prompt)):
            self.core.add_request(f"offline-{i}", tokens, p)
            results[f"offline-{i}"] = CompletionOutput("", [], None, len(tokens), 0)
        return results
