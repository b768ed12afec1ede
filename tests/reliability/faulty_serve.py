"""`python -m tests.reliability.faulty_serve serve ...`: the real `tokenwire serve` with a
forward-pass fault: every engine step that holds a request seeded FAULT_SEED raises inside
the model's forward (LlamaModel's, or the C++ decode stack's that replaces it in decode-only
steps, such as a prompt served from the prefix cache but its last token), as a failing
device would. Everything else is the real server."""
from __future__ import annotations

import sys

from engine.cpu_decode import CpuDecodeStack
from engine.model_runner import ModelRunner
from engine.models.llama import LlamaModel
from gateway.cli import main

FAULT_SEED = 666_001
MESSAGE = "injected forward fault"


def install() -> None:
    execute = ModelRunner.execute
    step = {"faulty": False}  # the engine steps on one thread, one step at a time

    def marked_execute(self, batch):
        step["faulty"] = any(r.params.seed == FAULT_SEED for r in batch.requests)
        return execute(self, batch)

    def faulty(forward):
        def faulty_forward(self, *args, **kwargs):
            if step["faulty"]:
                raise RuntimeError(MESSAGE)
            return forward(self, *args, **kwargs)
        return faulty_forward

    ModelRunner.execute = marked_execute
    LlamaModel.forward = faulty(LlamaModel.forward)
    CpuDecodeStack.forward = faulty(CpuDecodeStack.forward)


if __name__ == "__main__":
    install()
    sys.exit(main())
