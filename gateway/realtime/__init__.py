"""OpenAI Realtime API, text subset (GA event names), served at `GET /v1/realtime`.

    route.py        auth (Bearer or `openai-insecure-api-key.KEY`), subprotocol, session
    events.py       client events: msgspec schemas, decoding, encoding, RealtimeError
    server.py       server events as plain dicts (the shapes the SDKs parse)
    conversation.py the conversation's items (messages, function calls and their outputs)
                    over the tokenwire session's history
    prompt.py       the chat messages a response is generated from
    tools.py        tools and tool_choice, checked and planned by gateway/tools
    response.py     one response: the events that open and close it, its stream's frames
    protocol.py     RealtimeProtocol: what each client event does, on a SocketCore
"""
