"""SamplingParams refuses every bad number with InvalidRequestError naming the field, and
nothing else: a huge integer must not escape as OverflowError from float()."""
import dataclasses
import math

import pytest

from engine import SamplingParams
from engine.errors import InvalidRequestError

FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
          "frequency_penalty")
INTS = ("max_tokens", "top_k", "seed", "priority")
BAD = {"400 digits": 10**400, "-400 digits": -(10**400), "5000 digits": 10**5000,
       "inf": math.inf, "-inf": -math.inf, "nan": math.nan, "-1000": -1000,
       "1e308*10": 1e308 * 10}


@pytest.mark.parametrize("name", FLOATS + INTS)
@pytest.mark.parametrize("value", BAD.values(), ids=BAD.keys())
def test_bad_numbers_are_invalid_request_naming_the_field(name, value):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**{name: value})
    assert info.value.field == name


def test_a_copy_keeps_the_reduced_response_format():
    """n > 1 copies a request's params per sample (dataclasses.replace runs __post_init__
    again on the reduced response_format): the copy keeps the same constraint."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    params = SamplingParams(response_format={"type": "json_schema",
                                             "json_schema": {"name": "x", "schema": schema}})
    copy = dataclasses.replace(params, seed=3)
    assert copy.response_format == params.response_format == {"type": "json_schema",
                                                              "schema": schema}
