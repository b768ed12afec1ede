"""The runner and both transports against small real servers on loopback."""
import asyncio
import json

import pytest

from loadtest.backends import HttpBackend, WsBackend
from loadtest.cli import main
from loadtest.config import LoadTestConfig
from loadtest.datasets import Prompt
from loadtest.metrics import summarize
from loadtest.runner import Runner


def prompts(*texts, out=6):
    return [Prompt(t, 3, out) for t in texts]


async def run(cfg, backend, **workload):
    return await Runner(cfg, backend, show_progress=False).run(**workload)


@pytest.mark.parametrize("use_msgpack", [False, True])
async def test_ws_generate_counts_tokens_deltas_and_refusals(fake_server, use_msgpack):
    url = f"ws://127.0.0.1:{fake_server.port}/v1/ws"
    cfg = LoadTestConfig(url=url, use_msgpack=use_msgpack, max_concurrency=2)
    backend = WsBackend(url, "completions", use_msgpack, 0.0, True)
    out = await run(cfg, backend, prompts=prompts("a", "b", "REFUSE me", "c", out=6))
    assert out.model == "fake"
    ok = [r for r in out.records if r.success]
    assert len(ok) == 3
    assert all(r.num_deltas == 3 and r.client_tokens == 6 == r.output_tokens for r in ok)
    assert all(len(r.itl) == 2 and 0 < r.ttft <= r.latency for r in ok)
    assert all(r.server_ttft_ms == 1.0 for r in ok)
    result = summarize(out.records, out.duration, out.t0)
    assert result["errors_by_code"] == {"overloaded": 1}
    assert result["total_output_tokens"] == 18
    assert fake_server.sockets <= 2  # idle sockets are reused, at most one per slot


async def test_ws_sessions_send_chat_turns_on_one_socket(fake_server):
    url = f"ws://127.0.0.1:{fake_server.port}/v1/ws"
    cfg = LoadTestConfig(url=url, dataset="sessions", num_sessions=2, turns=3,
                         think_time=0.01)
    backend = WsBackend(url, "chat", False, 0.0, False)
    sessions = [prompts("s0t0", "s0t1", "s0t2", out=4), prompts("s1t0", "s1t1", "s1t2", out=4)]
    out = await run(cfg, backend, sessions=sessions)
    assert sorted((r.session, r.turn) for r in out.records) == \
        [(s, t) for s in range(2) for t in range(3)]
    assert all(r.success for r in out.records)
    # The backend's first (probe) socket runs no chat; each session has one socket of 3 turns.
    assert sorted(fake_server.chats_per_socket) == [0, 3, 3]
    turns = summarize(out.records, out.duration, out.t0)["per_turn"]
    assert [row["completed"] for row in turns] == [2, 2, 2]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_http_sse_uses_server_usage_and_maps_503(fake_server, endpoint):
    url = f"http://127.0.0.1:{fake_server.port}/v1"
    cfg = LoadTestConfig(url=url, endpoint=endpoint)
    backend = HttpBackend(url, endpoint, None, 0.0, False)
    out = await run(cfg, backend, prompts=prompts("a", "REFUSE", out=5))
    assert out.model == "fake-model"
    ok, refused = out.records[0], out.records[1]
    assert ok.success and ok.num_deltas == 5 and ok.output_tokens == 5
    assert ok.usage_prompt_tokens == 4 and ok.text == "xxxxx"
    assert not refused.success and refused.error_code == "overloaded"


async def test_http_sends_each_request_on_its_own_connection(fake_server):
    """No keep-alive reuse: a relay in front of the server counts one connection per
    request, so a connection the server closed while idle is never sent a request."""
    connections = []

    async def relay(reader, writer):
        connections.append(writer)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", fake_server.port)

        async def pipe(src, dst):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    backend = HttpBackend(url, "completions", "fake-model", 0.0, False, max_connections=1)
    out = await run(LoadTestConfig(url=url), backend, prompts=prompts("a", "b", "c", out=4))
    server.close()
    assert all(r.success and r.output_tokens == 4 for r in out.records)
    assert len(connections) == 3


async def test_http_sessions_resend_growing_history(fake_server):
    url = f"http://127.0.0.1:{fake_server.port}/v1"
    cfg = LoadTestConfig(url=url, dataset="sessions", num_sessions=1, turns=2)
    backend = HttpBackend(url, "completions", None, 0.0, False)
    out = await run(cfg, backend, sessions=[prompts("first", "second", out=3)])
    assert [r.success for r in out.records] == [True, True]
    assert out.records[1].turn == 1


async def test_duration_cap_cuts_off_hanging_requests(fake_server):
    url = f"ws://127.0.0.1:{fake_server.port}/v1/ws"
    cfg = LoadTestConfig(url=url, duration=0.5)
    backend = WsBackend(url, "completions", False, 0.0, False)
    out = await run(cfg, backend, prompts=prompts("fine", "HANG", out=4))
    codes = {r.error_code for r in out.records}
    assert codes == {None, "timeout"}
    assert out.duration < 30  # returned at the cap, not after the hour-long hang


async def test_cli_writes_summary_json_and_plot(fake_server, tmp_path, capsys):
    result_path, plot_path = tmp_path / "r.json", tmp_path / "p.png"
    # The CLI runs its own event loop: a thread, while this loop serves the fake server.
    rc = await asyncio.to_thread(main, ["--url", f"ws://127.0.0.1:{fake_server.port}/v1/ws", "--tokenizer", "none",
               "--num-prompts", "6", "--random-input-len", "8", "--random-output-len", "8",
               "--request-rate", "50", "--burstiness", "0.5", "--percentiles", "50,90,99",
               "--goodput", "ttft:10000", "--result-json", str(result_path),
               "--plot", str(plot_path), "--disable-tqdm"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "Serving Benchmark Result" in printed and "P90 TTFT (ms):" in printed
    data = json.loads(result_path.read_text())
    assert data["completed"] == 6 and data["total_output_tokens"] == 48
    assert data["request_goodput"] > 0 and len(data["ttfts"]) == 6
    assert data["request_rate"] == 50.0 and "p90_itl_ms" in data
    assert plot_path.read_bytes()[:4] == b"\x89PNG"


def test_cli_refuses_remote_host_and_bad_goodput(capsys):
    assert main(["--url", "http://8.8.8.8/v1"]) == 2
    assert main(["--goodput", "speed:3"]) == 2
    assert "allow-remote" in capsys.readouterr().err
