"""The openai npm package (pinned in tests/gateway/js/package.json) against /v1/responses:
plain, streamed, a 5-turn chain, text.format json_schema and a forced tool call, each
parsed by the Node SDK as a Node user would see it."""
from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import jsonschema

from test_clients import TOOLS, require

SCRIPT = Path(__file__).parent / "js" / "responses_node.mjs"
WEATHER = {"type": "object", "required": ["city", "days"], "additionalProperties": False,
           "properties": {"city": {"type": "string", "maxLength": 20},
                          "days": {"type": "integer", "minimum": 1, "maximum": 9}}}


async def test_node_openai_responses(base_url):
    require(TOOLS / "openai")
    proc = await asyncio.create_subprocess_exec(
        shutil.which("node") or "node", str(SCRIPT), base_url + "/v1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, err.decode()[-2000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["plain"] and result["plain_status"] in ("completed", "incomplete")
    assert result["streamed"] and result["kinds"][0] == "response.created"
    assert result["kinds"][-1] in ("response.completed", "response.incomplete")
    assert result["inputs"] == sorted(set(result["inputs"]))  # each turn sees the chain
    jsonschema.validate(json.loads(result["structured"]), WEATHER)
    assert result["call"]["name"] == "get_weather"
    jsonschema.validate(json.loads(result["call"]["arguments"]), WEATHER)
