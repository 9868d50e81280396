"""sandboxes/orphans.py on a scripted client: which containers count as orphans, and the once-per-process sweep."""

from __future__ import annotations

import os

import pytest

from sao.sandboxes.orphans import OnceReaper, dead_owner, reap_orphans


def test_only_this_hosts_dead_owners_are_orphans():
    dead = {41}
    alive = lambda pid: pid not in dead  # noqa: E731
    assert dead_owner("vm:41", "vm", alive)
    assert not dead_owner("vm:42", "vm", alive)  # alive
    assert not dead_owner("other:41", "vm", alive)  # another host sharing the daemon
    assert not dead_owner("a:b:41", "a", alive)  # the host is all before the last colon
    assert dead_owner("a:b:41", "a:b", alive)
    for unreadable in (None, "", "vm", "vm:", "vm:x", "vm:0", "vm:-1"):
        assert not dead_owner(unreadable, "vm", alive), unreadable


class Container:
    def __init__(self, name: str, owner: str | None) -> None:
        self.name, self.labels, self.removed = name, ({"io.sao.sandbox.owner": owner} if owner else {}), False

    def remove(self, force: bool, v: bool) -> None:
        assert force and v
        self.removed = True


class Client:
    def __init__(self, containers: list[Container]) -> None:
        self.containers_ = containers
        self.lists = 0

    @property
    def containers(self):  # type: ignore[no-untyped-def]
        return self

    def list(self, all: bool, filters: dict, ignore_removed: bool = False) -> list[Container]:  # noqa: A002 - docker's
        assert all and filters == {"label": "io.sao.sandbox"}
        assert ignore_removed  # a container removed between docker's list and inspect calls is no error
        self.lists += 1
        return [c for c in self.containers_ if not c.removed]


def test_reap_removes_the_dead_owners_containers_only(caplog: pytest.LogCaptureFixture):
    cs = [Container("a", "vm:41"), Container("b", "vm:42"), Container("c", "far:41"), Container("d", None)]
    assert reap_orphans(Client(cs), host="vm", alive=lambda pid: pid != 41) == ["a"]
    assert [c.removed for c in cs] == [True, False, False, False]
    assert "left by processes that died" in caplog.text


def test_the_sweep_runs_once_per_process_and_never_stops_a_sandbox():
    client = Client([Container("a", f"nohost-{os.getpid()}:1")])
    once = OnceReaper()
    once(client)
    once(client)
    assert client.lists == 1

    class Broken:
        @property
        def containers(self):  # type: ignore[no-untyped-def]
            raise ConnectionError("daemon gone")

    OnceReaper()(Broken())  # logged, not raised: the sandbox it precedes reports the daemon itself
