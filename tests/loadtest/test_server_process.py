"""ServerProcess gives up as soon as the server says its model failed to load: the server
stays up to report it on /health, so waiting for /ready would last the whole timeout."""
import time

import pytest

from loadtest.server_process import ServerProcess


def test_a_model_that_fails_to_load_ends_the_wait_at_once(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # no model_type: the loader refuses it
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="did not become ready") as failed:
        with ServerProcess(["--model", str(tmp_path), "--device", "cpu"], ready_timeout_s=120):
            pass
    assert time.monotonic() - started < 60
    assert "cannot load model" in str(failed.value)
