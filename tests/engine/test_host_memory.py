"""engine.host_memory: glibc accepts the settings (the CI box runs glibc)."""
import platform

import pytest

from engine.host_memory import keep_freed_step_buffers


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_malloc_settings():
    assert keep_freed_step_buffers() is True
