"""Every unknown route and wrong method under /v1 answers OpenAI's JSON error shape, so
the SDKs show a message; GET /v1/models/{id} answers the served model or a JSON 404."""
from __future__ import annotations

import aiohttp
import openai
import pytest


async def test_models_retrieve_answers_the_served_model(client):
    listed = (await client.models.list()).data[0]
    model = await client.models.retrieve(listed.id)
    assert (model.id, model.object) == (listed.id, "model")
    with pytest.raises(openai.NotFoundError) as info:
        await client.models.retrieve("no-such/model")
    assert info.value.body["code"] == "model_not_found"
    assert "no-such/model" in info.value.body["message"]


async def test_an_unknown_endpoint_is_a_json_404_the_sdk_reads(client):
    with pytest.raises(openai.NotFoundError) as info:
        await client.embeddings.create(model="m", input="hi")
    assert info.value.body["code"] == "not_found"
    assert "/v1/embeddings" in info.value.body["message"]


@pytest.mark.parametrize("method,path,allow", [
    ("GET", "/v1/chat/completions", {"POST"}),
    ("DELETE", "/v1/models", {"GET", "HEAD"}),
    ("POST", "/v1/ws", {"GET", "HEAD"}),
])
async def test_a_wrong_method_is_a_json_405_with_allow(base_url, method, path, allow):
    async with aiohttp.ClientSession() as http, http.request(method, base_url + path) as resp:
        assert resp.status == 405
        assert set(resp.headers["Allow"].split(",")) == allow
        error = (await resp.json())["error"]
    assert error["code"] == "method_not_allowed" and method in error["message"]


async def test_outside_v1_routing_is_left_alone(base_url):
    async with aiohttp.ClientSession() as http:
        async with http.get(base_url + "/v1/nothing/here") as resp:
            assert resp.status == 404 and (await resp.json())["error"]["code"] == "not_found"
        async with http.get(base_url + "/nothing") as resp:
            assert resp.status == 404 and resp.content_type == "text/plain"
