"""tokenwire's gateway: everything on the wire (docs/architecture.md).

    app.py, runtime.py     the aiohttp app, its resources' lifecycle, the drain, shared state
    sockets/               one WebSocket's mechanics, used by every protocol below
    ws/, realtime/         protocol v1 (/v1/ws) and OpenAI Realtime (/v1/realtime)
    openai/                OpenAI's HTTP API and SSE (/v1/chat/completions, /v1/completions)
    sessions/              sessions across sockets, restarts and replicas
    params.py, messages.py what requests carry, typed at the edge
    errors.py, auth.py     errors as data; keys and origins
    stream.py, logprobs.py one request's life; log-probabilities in each wire shape
    config.py, metrics.py  GatewayConfig; Prometheus metrics
    cli/                   the `tokenwire` console script
"""
