"""The controller's state store: SQLite by default, Redis on request (FailLite 4, "Data Store").

The controller persists what it must not forget across a restart: the apps with their home
placement and current route, the warm backups, the servers' health and what each server holds, and
the routing-table version. A restarted controller reads it back and resumes without reloading a
model that a healthy server still holds.

The store is a small document store: one *document* (a JSON-able dict) per ``(kind, key)``, e.g.
``("apps", "cam-1")``. :meth:`Store.write` replaces whole kinds in one transaction (an SQLite
transaction; a Redis ``MULTI``), so a reader never sees half a state. Every cluster has its own
namespace (the config's ``name``), so clusters can share one Redis.

URLs: ``sqlite`` (``<state_dir>/state.db``), ``sqlite:///PATH``, ``redis://HOST:PORT/DB``.
Every failure of the backend becomes a :class:`~failsoft.errors.StoreError`.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from failsoft.errors import ConfigError, StoreError

Document = dict[str, Any]
State = dict[str, dict[str, Document]]  # kind -> key -> document


class Store(ABC):
    """A namespaced document store; ``write`` is atomic across kinds."""

    url: str

    @abstractmethod
    def read(self) -> State:
        """Every kind and document of this namespace (empty when nothing was written)."""

    @abstractmethod
    def write(self, kinds: Mapping[str, Mapping[str, Document]]) -> None:
        """Replace the documents of each kind given, all in one transaction."""

    @abstractmethod
    def clear(self) -> None:
        """Forget everything of this namespace."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SqliteStore(Store):
    """One table ``docs(ns, kind, key, doc)`` in a WAL-mode SQLite file."""

    def __init__(self, path: Path, namespace: str) -> None:
        self.url = f"sqlite:///{path}"
        self.namespace = namespace
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), check_same_thread=False, timeout=10.0)
            with self._db:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute(
                    "CREATE TABLE IF NOT EXISTS docs (ns TEXT NOT NULL, kind TEXT NOT NULL, "
                    "key TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (ns, kind, key))"
                )
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open SQLite store {str(path)!r}: {exc}") from exc

    def read(self) -> State:
        try:
            with self._lock:
                rows = self._db.execute(
                    "SELECT kind, key, doc FROM docs WHERE ns = ?", (self.namespace,)
                ).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite store {self.url}: read failed: {exc}") from exc
        state: State = {}
        for kind, key, doc in rows:
            state.setdefault(kind, {})[key] = json.loads(doc)
        return state

    def write(self, kinds: Mapping[str, Mapping[str, Document]]) -> None:
        try:
            with self._lock, self._db:
                for kind, docs in kinds.items():
                    self._db.execute("DELETE FROM docs WHERE ns = ? AND kind = ?", (self.namespace, kind))
                    self._db.executemany(
                        "INSERT INTO docs (ns, kind, key, doc) VALUES (?, ?, ?, ?)",
                        [(self.namespace, kind, key, json.dumps(doc)) for key, doc in docs.items()],
                    )
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite store {self.url}: write failed: {exc}") from exc

    def clear(self) -> None:
        try:
            with self._lock, self._db:
                self._db.execute("DELETE FROM docs WHERE ns = ?", (self.namespace,))
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite store {self.url}: clear failed: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()


class RedisStore(Store):
    """One Redis hash per kind, ``failsoft:<namespace>:<kind>``, plus a set of the kinds."""

    def __init__(self, url: str, namespace: str) -> None:
        import redis

        self.url = url
        self.namespace = namespace
        self._errors = (redis.RedisError, OSError)
        try:
            self._redis = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
            self._redis.ping()
        except self._errors as exc:
            raise StoreError(f"cannot reach Redis store {url}: {exc}") from exc

    def _key(self, kind: str) -> str:
        return f"failsoft:{self.namespace}:{kind}"

    @property
    def _kinds_key(self) -> str:
        return f"failsoft:{self.namespace}:__kinds__"

    def read(self) -> State:
        try:
            # redis types members as bytes | str; without decode_responses they are bytes
            kinds = sorted(k.decode() for k in self._redis.smembers(self._kinds_key))  # type: ignore[union-attr]
            pipe = self._redis.pipeline(transaction=True)
            for kind in kinds:
                pipe.hgetall(self._key(kind))
            hashes = pipe.execute()
        except self._errors as exc:
            raise StoreError(f"Redis store {self.url}: read failed: {exc}") from exc
        return {
            kind: {k.decode(): json.loads(v) for k, v in h.items()}
            for kind, h in zip(kinds, hashes, strict=True)
            if h
        }

    def write(self, kinds: Mapping[str, Mapping[str, Document]]) -> None:
        try:
            pipe = self._redis.pipeline(transaction=True)
            for kind, docs in kinds.items():
                pipe.delete(self._key(kind))
                if docs:
                    pipe.hset(self._key(kind), mapping={k: json.dumps(d) for k, d in docs.items()})
                pipe.sadd(self._kinds_key, kind)
            pipe.execute()
        except self._errors as exc:
            raise StoreError(f"Redis store {self.url}: write failed: {exc}") from exc

    def clear(self) -> None:
        try:
            kinds = [k.decode() for k in self._redis.smembers(self._kinds_key)]  # type: ignore[union-attr]
            self._redis.delete(*[self._key(k) for k in kinds], self._kinds_key)
        except self._errors as exc:
            raise StoreError(f"Redis store {self.url}: clear failed: {exc}") from exc

    def close(self) -> None:
        self._redis.close()


def open_store(url: str, state_dir: Path, namespace: str) -> Store:
    """The store a URL names: ``sqlite``, ``sqlite:///PATH`` or ``redis://HOST:PORT/DB``."""
    if url == "sqlite":
        return SqliteStore(state_dir / "state.db", namespace)
    if url.startswith("sqlite:///"):
        return SqliteStore(Path(url.removeprefix("sqlite:///")).expanduser(), namespace)
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(url, namespace)
    raise ConfigError(f"unknown store {url!r} (use 'sqlite', 'sqlite:///PATH' or 'redis://HOST:PORT/DB')")
