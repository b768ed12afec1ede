"""bf16 and fp16 on CPU, with the plain-torch and the C++ backends: the C++ kernels are
fp32-only, so every op they cannot do must fall back to torch and the engine must still
produce the fp32 model's greedy tokens (up to the first near-tie that rounding flips)."""
import pytest

from engine import LLM, SamplingParams
from tests.engine.conftest import assert_all_blocks_free

PROMPTS = ["The capital of France is", "Story: the dragon and the knight went to",
           "def fibonacci(n):", "List three colors: red,"]
PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
# Rounding may flip a near-tie (one of these prompts has two candidates 0.12 apart at
# logit 21, below bf16's resolution), so: the first tokens (a prefill and a decode) agree
# for every request, and most requests agree on every token.
SAME_PREFIX = 2


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.fixture(scope="module")
def fp32_tokens(llm):
    return [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_generates_fp32_greedy_tokens_on_both_backends(dtype, fp32_tokens):
    outputs = {}
    for backend in ("torch", "cpu"):
        # a small token budget mixes decodes with prefill chunks in one step
        engine = LLM(model="default", device="cpu", dtype=dtype, attention_backend=backend,
                     max_num_batched_tokens=16, num_kv_blocks=64)
        outs = engine.generate(PROMPTS, PARAMS)
        assert all(len(o.token_ids) == PARAMS.max_tokens for o in outs)
        outputs[backend] = [o.token_ids for o in outs]
        assert_all_blocks_free(engine.core)
    # the C++ backend runs no kernel at these dtypes: it is the torch path exactly
    assert outputs["cpu"] == outputs["torch"]
    shared = [common_prefix(got, want) for got, want in zip(outputs["torch"], fp32_tokens)]
    assert min(shared) >= SAME_PREFIX, shared
    assert sum(n == PARAMS.max_tokens for n in shared) >= len(PROMPTS) - 1, shared
