"""How near the default model's logprobs come to those of fp32 activations (Hugging Face's
forward pass of the same weights) on this CPU. Its quantized matmuls round a step's
activations to int8 levels: portable's dots read three, the AVX2 and AVX-512 dots two.
`python -m loadtest.logprob_error` measures the distances (12 prompts x 32 tokens, greedy
and 4 sampled runs, 11,520 values an instruction set; docs/quantization.md has the run and
its device): three levels, median 1.3e-5 and at most 1.9e-4; two levels, median 7.5e-4
(AVX2) and 1.1e-3 (AVX-512), at most 1.8e-2 and 2.4e-2. The bounds below leave each a
factor of 2 to 4. AVX-512 dots made to read one level put a logprob 0.66 off: 13 times
the bound.
Asked inside a test, never while collecting: it builds the kernels."""
import functools
import statistics
from dataclasses import dataclass

import kernels.cpu as cpu_kernels


@dataclass(frozen=True)
class LogprobTolerance:
    each: float    # the most one logprob may lie from fp32's
    median: float  # the most the median distance over a test's logprobs may be


EXACT = LogprobTolerance(each=1e-4, median=1e-5)  # fp32 throughout: summation order only
THREE_LEVELS = LogprobTolerance(each=5e-4, median=5e-5)
TWO_LEVELS = LogprobTolerance(each=5e-2, median=5e-3)


@functools.cache
def logprob_tolerance() -> LogprobTolerance:
    quant = cpu_kernels.load_quant()
    if quant is None:  # the plain-torch path
        return EXACT
    isa = cpu_kernels.quant_isa()
    levels = quant.activation_levels(isa if isa >= 0 else quant.best_isa())
    return THREE_LEVELS if levels >= 3 else TWO_LEVELS


def assert_near_fp32(ours: list[float], fp32: list[float]) -> None:
    """Each of our logprobs within `each` of fp32's, and their median distance within
    `median`: a kernel that rounds coarser than it should moves the median first."""
    near = logprob_tolerance()
    assert len(ours) == len(fp32) > 0
    distances = [abs(a - b) for a, b in zip(ours, fp32)]
    worst = max(range(len(distances)), key=distances.__getitem__)
    assert distances[worst] <= near.each, (
        f"logprob {ours[worst]} is {distances[worst]:.2e} from fp32's {fp32[worst]} "
        f"(tolerance {near.each:.0e})")
    assert statistics.median(distances) <= near.median, (
        f"median distance {statistics.median(distances):.2e} from fp32's logprobs "
        f"(tolerance {near.median:.0e})")


def assert_same_top(ours: list[int], fp32_row) -> None:
    """Our top tokens are fp32's top ones (fp32_row: its logprobs over the vocabulary),
    except where a token of fp32's top lies within twice the tolerance of the least likely
    one we list: each of the two logprobs may be off by up to `each`, so they may swap."""
    tie = 2 * logprob_tolerance().each
    least = min(fp32_row[t].item() for t in ours)
    for token in fp32_row.topk(len(ours)).indices.tolist():
        if token not in ours:
            assert fp32_row[token].item() <= least + tie, (
                f"fp32's top token {token} is missing from ours {ours}")
