"""Sessions: what a conversation keeps across sockets, restarts and replicas.

    live.py      LiveSession, the one place a session is edited
    registry.py  SessionRegistry: one LiveSession per id, loads and saves
    store.py     the store interface, SessionRecord, limits, the in-memory store
    factory.py   make_session_store: in memory, sqlite.py or redis.py by URL
"""
