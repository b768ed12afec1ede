import pytest

from engine import LLM


@pytest.fixture(scope="session")
def llm():
    """The default model on CPU in fp32, shared by the engine tests."""
    return LLM(model="default", device="cpu", max_num_batched_tokens=512)


def assert_all_blocks_free(core):
    assert core.blocks.num_free_blocks == core.blocks.num_blocks
    sched = core.step_scheduler
    assert not core.requests and not sched.running and not sched.waiting
