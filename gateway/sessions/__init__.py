"""Sessions: what a conversation keeps across sockets, restarts and replicas.

    live.py      LiveSession, the one place a session is edited
    registry.py  SessionRegistry: one LiveSession per id, loads and saves, `healthy`
    store.py     the store interface, SessionRecord, limits and quotas, the in-memory store
    sqlite.py    the SQLite store (sqlite_file.py: its file's mode and identity)
    redis.py     the Redis store
    factory.py   make_session_store: in memory, sqlite.py or redis.py by URL
"""
