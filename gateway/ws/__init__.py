"""tokenwire's WebSocket protocol v1, served at `GET /v1/ws` (docs/protocol.md).

    route.py     the upgrade: origin, key, subprotocol (JSON or msgpack)
    frames.py    client message schemas, decoding, the server frames' shapes
    protocol.py  V1Protocol: what each message does, on a SocketCore
    chat.py      one chat turn in the socket's session
"""
