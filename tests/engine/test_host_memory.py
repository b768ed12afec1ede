"""engine.host_memory: glibc accepts the settings (the CI box runs glibc); the KV pool's
lazily mapped small pages."""
import platform

import pytest
import torch

from engine import SamplingParams
from engine.host_memory import keep_freed_step_buffers, lazy_zeros


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_malloc_settings():
    assert keep_freed_step_buffers() is True


def mapping_kb(tensor: torch.Tensor) -> dict[str, int]:
    """The /proc/self/smaps sizes (kB) of the mapping that holds the tensor's data."""
    address = tensor.data_ptr()
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        start, dash, end = line.split()[0].partition("-")  # a mapping's header: start-end
        if dash and int(start, 16) <= address < int(end, 16):
            fields = {}
            for entry in lines[i + 1:]:
                key, _, value = entry.partition(":")
                if not value.strip().endswith("kB"):
                    break
                fields[key] = int(value.split()[0])
            return fields
    raise AssertionError("no mapping holds the tensor")


def transparent_huge_pages() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "never"


linux_only = pytest.mark.skipif(platform.system() != "Linux", reason="reads /proc/self/smaps")


@linux_only
def test_lazy_zeros_take_memory_only_where_written():
    t = lazy_zeros((64, 1024, 256), torch.float32)  # 64 MiB
    assert t.shape == (64, 1024, 256) and t.dtype == torch.float32
    assert mapping_kb(t)["Rss"] < 1024
    t[3] = 1.0  # 1 MiB
    assert 1024 <= mapping_kb(t)["Rss"] < 2048
    assert t.sum().item() == 1024 * 256 and t[:3].abs().sum().item() == 0


@linux_only
@pytest.mark.skipif(transparent_huge_pages() == "never", reason="this kernel makes no huge pages")
def test_the_engines_kv_pool_takes_no_huge_pages(llm):
    """A first write into a huge page faults in 2 MB at once: 60 of them in one decode step
    stalled it 110-260 ms (host_memory.lazy_zeros). The pool stays in small pages."""
    llm.generate([list(range(100, 900))], SamplingParams(max_tokens=2, temperature=0.0))
    for k_cache, v_cache in llm.core.runner.kv_caches[:2]:
        for cache in (k_cache, v_cache):
            sizes = mapping_kb(cache)
            assert sizes["Rss"] > 0 and sizes["AnonHugePages"] == 0
