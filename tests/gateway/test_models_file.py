"""`--model [NAME=]SOURCE` and `--models FILE`: which models `tokenwire serve` serves."""
from __future__ import annotations

import pytest

from common.errors import ConfigError
from engine.config import EngineConfig
from gateway.cli.models import model_specs, split_model_flag


def test_a_name_is_split_off_only_where_it_is_a_name():
    assert split_model_flag("chat=default") == ("chat", "default")
    assert split_model_flag("dummy:tiny") == (None, "dummy:tiny")
    assert split_model_flag("/models/a=b") == (None, "/models/a=b")  # a path, not a name


def test_one_model_keeps_its_own_name_and_never_unloads():
    specs, budget = model_specs(None, None, EngineConfig(), 300)
    assert [(s.name, s.engine.model, s.keep_alive_s, s.preload) for s in specs] == \
        [(None, "default", -1, True)]
    assert budget is None


def test_flags_then_file_tables_in_order(tmp_path):
    file = tmp_path / "models.toml"
    file.write_text('memory_budget_bytes = 1000\n[[model]]\nname = "c"\nsource = "dummy:tiny"'
                    '\nmax_model_len = 512\nkeep_alive_s = 0\npreload = true\n'
                    '[[model]]\nsource = "dummy:smollm2-135m"\n')
    specs, budget = model_specs(["default", "b=dummy:tiny"], str(file),
                                EngineConfig(max_num_seqs=4), 60)
    assert [s.name for s in specs] == ["SmolLM2-135M-Instruct", "b", "c",
                                       "dummy:smollm2-135m"]
    assert [s.keep_alive_s for s in specs] == [-1, 60, 0, 60]
    assert [s.preload for s in specs] == [True, False, True, False]
    assert specs[2].engine.max_model_len == 512 and specs[2].engine.max_num_seqs == 4
    assert specs[1].engine.max_model_len is None
    assert budget == 1000


@pytest.mark.parametrize("body, problem", [
    ('[[model]]\nsource = "dummy:tiny"\nmax_modle_len = 5\n', "unknown keys"),
    ('[[model]]\nname = "x"\n', "no source"),
    ('models = 3\n', "unknown keys"),
    ('[[model]\n', "models"),
])
def test_a_bad_file_is_a_config_error(tmp_path, body, problem):
    file = tmp_path / "models.toml"
    file.write_text(body)
    with pytest.raises(ConfigError, match=problem):
        model_specs(None, str(file), EngineConfig(), 300)


def test_two_models_may_not_share_a_name():
    with pytest.raises(ConfigError, match="share a name"):
        model_specs(["dummy:tiny", "dummy:tiny"], None, EngineConfig(), 300)
