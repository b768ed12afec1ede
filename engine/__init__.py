"""tokenwire's engine: continuous batching over a paged KV cache (see DESIGN.md, Engine)."""
from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.errors import (EngineDeadError, EngineError, InvalidRequestError, ModelLoadError,
                           PromptTooLongError)
from engine.llm import LLM
from engine.outputs import CompletionOutput, EngineStats, RequestOutput
from engine.sampling_params import SamplingParams

__all__ = ["AsyncEngine", "CompletionOutput", "EngineConfig", "EngineDeadError", "EngineError",
           "EngineStats", "InvalidRequestError", "LLM", "ModelLoadError", "PromptTooLongError",
           "RequestOutput", "SamplingParams"]
