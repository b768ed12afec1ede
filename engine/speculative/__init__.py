"""Speculative decoding without a draft model: proposals from the request's own tokens,
verified by the target model in the engine's normal step (engine.speculative.verify)."""
from engine.speculative.ngram import NgramProposer

__all__ = ["NgramProposer"]
