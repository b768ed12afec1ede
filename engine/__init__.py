"""tokenwire's engine: continuous batching over a paged KV cache (docs/engine.md).

The names below load on first use, so that `engine.errors` and `engine.outputs` (plain
Python) can be imported by the scheduler and the gateway without loading torch.
"""
import importlib

_EXPORTS = {
    "AsyncEngine": "engine.async_engine", "EngineConfig": "engine.config",
    "ConfigError": "engine.errors", "DeviceGate": "engine.device_gate",
    "GateParty": "engine.device_gate", "EngineDeadError": "engine.errors",
    "EngineError": "engine.errors", "InvalidRequestError": "engine.errors",
    "ModelLoadError": "engine.errors", "PromptTooLongError": "engine.errors",
    "LLM": "engine.llm", "Mailbox": "engine.mailbox", "CompletionOutput": "engine.outputs", "EngineStats": "engine.outputs",
    "RequestOutput": "engine.outputs", "SamplingParams": "engine.sampling_params",
    "release_free_heap": "engine.host_memory", "served_name": "engine.loader",
    "import_loading_code": "engine.loader",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
