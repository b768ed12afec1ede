"""How near the default model's logprobs come to those of fp32 activations (Hugging Face's
forward pass of the same weights) on this CPU. Its quantized matmuls round a decode step's
activations to int8 levels: three keep logprobs within 1e-4; the AVX2 and AVX-512 dots read
two, measured within 4.4e-3 (chosen and top-5 logprobs, 9 prompts x 32 tokens:
docs/quantization.md), so 1e-2 there. Asked inside a test, never while collecting: it builds
the kernels."""
import functools

import kernels.cpu as cpu_kernels


@functools.cache
def logprob_tolerance() -> float:
    quant = cpu_kernels.load_quant()
    if quant is None:  # the plain-torch path: fp32 throughout
        return 1e-4
    isa = cpu_kernels.quant_isa()
    return 1e-4 if quant.activation_levels(isa if isa >= 0 else quant.best_isa()) >= 3 else 1e-2
