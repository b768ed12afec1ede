import pytest

from engine import LLM, block_manager


@pytest.fixture(scope="session")
def llm():
    """The default model on CPU in fp32, shared by the engine tests."""
    return LLM(model="default", device="cpu", max_num_batched_tokens=512)


def assert_all_blocks_free(core):
    assert core.blocks.num_free_blocks == core.blocks.num_blocks
    sched = core.step_scheduler
    assert not core.requests and not sched.running and not sched.waiting


def forge_keys(monkeypatch, key):
    """Key the prefix cache's blocks by `key(real_hash, parent_hash, token_ids)`, to make
    keys collide on purpose."""
    real = block_manager.hash_block_tokens
    monkeypatch.setattr(block_manager, "hash_block_tokens",
                        lambda parent, token_ids: key(real, parent, token_ids))
