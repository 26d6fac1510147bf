"""Both stores against the real thing: an SQLite file and a real redis-server (see conftest)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from failsoft.errors import ConfigError, StoreError
from failsoft.runtime.store import RedisStore, SqliteStore, Store, open_store


@pytest.fixture(params=["sqlite", "redis"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[str], Store]]:
    """A factory of stores over one backend: ``make_store(namespace)``; every store is closed after."""
    opened: list[Store] = []
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'state.db'}"
    else:
        url = request.getfixturevalue("redis_url")

    def make(namespace: str) -> Store:
        store = open_store(url, tmp_path, namespace)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.clear()
        store.close()


def test_what_is_written_is_read_back_by_a_new_connection(make_store):
    docs = {"apps": {"cam-1": {"route": {"server": "s2", "variant": "v"}}, "cam-2": {"route": None}}}
    make_store("c1").write(docs)
    assert make_store("c1").read() == docs  # another connection: what a restarted controller sees


def test_write_replaces_whole_kinds_and_leaves_the_others(make_store):
    store = make_store("c1")
    store.write({"apps": {"a": {"n": 1}, "b": {"n": 2}}, "warm": {"a@s1": {"v": "x"}}})
    store.write({"apps": {"b": {"n": 3}}})
    assert store.read() == {"apps": {"b": {"n": 3}}, "warm": {"a@s1": {"v": "x"}}}
    store.write({"warm": {}})
    assert store.read() == {"apps": {"b": {"n": 3}}}


def test_clusters_do_not_see_each_other(make_store):
    make_store("one").write({"apps": {"a": {"x": 1}}})
    make_store("two").write({"apps": {"b": {"x": 2}}})
    assert make_store("one").read() == {"apps": {"a": {"x": 1}}}
    make_store("one").clear()
    assert make_store("one").read() == {}
    assert make_store("two").read() == {"apps": {"b": {"x": 2}}}


def test_the_default_store_is_sqlite_in_the_state_dir(tmp_path):
    with open_store("sqlite", tmp_path / "state", "c") as store:
        assert isinstance(store, SqliteStore)
        store.write({"meta": {"k": {"v": 1}}})
    assert (tmp_path / "state" / "state.db").is_file()


def test_store_failures_are_store_errors(tmp_path, redis_url):
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(StoreError, match="cannot reach Redis store"):
        RedisStore(f"redis://127.0.0.1:{port + 1 if port < 65535 else port - 1}/0", "c")
    with pytest.raises(ConfigError, match="unknown store"):
        open_store("mysql://x", tmp_path, "c")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match="cannot open SQLite store"):
        SqliteStore(blocker / "state.db", "c")


def test_a_missing_redis_server_fails_under_ci_and_is_skipped_elsewhere():
    from tests.runtime.conftest import no_redis_server

    with pytest.raises(pytest.fail.Exception, match="CI=true and no redis-server"):
        no_redis_server({"CI": "true"})
    with pytest.warns(UserWarning, match="REDIS TESTS SKIPPED"), pytest.raises(pytest.skip.Exception):
        no_redis_server({})
