"""The tokenizer used to build and measure prompts: the default model's, a local one, or none."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def load_tokenizer(spec: str):
    """"default": the embedded model's tokenizer (via the engine's loader, which keeps a
    cached copy); "none": no tokenizer (prompts of random words, lengths estimated);
    anything else: a local Hugging Face tokenizer directory. Falls back to none, with a
    warning, when the default cannot be loaded here (e.g. the client runs without torch)."""
    if spec == "none":
        return None
    from transformers import AutoTokenizer

    if spec != "default":
        return AutoTokenizer.from_pretrained(spec)
    try:
        from engine.loader import default_model_dir

        return AutoTokenizer.from_pretrained(default_model_dir())
    except Exception as exc:  # noqa: BLE001 - any failure here only degrades prompt text
        log.warning("default tokenizer unavailable (%s); using random words", exc)
        return None
