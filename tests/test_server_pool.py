"""The pool of running tool servers that from-config MCP environments and the tau2 plug-in share."""

import pytest

from trajtune.envs.adapters.server_pool import ServerPool


class FakeServer:
    started = 0

    def __init__(self) -> None:
        FakeServer.started += 1
        self.n = FakeServer.started
        self.running = True
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.running = False


def test_a_given_back_server_is_reused_per_key():
    pool = ServerPool()
    a = pool.borrow("a", FakeServer)
    b = pool.borrow("a", FakeServer)  # a is out: a second one starts
    assert a is not b
    pool.give_back("a", a)
    assert pool.borrow("a", FakeServer) is a
    assert pool.borrow("other", FakeServer) not in (a, b)  # another key never gets a's servers
    assert len(pool.all) == 3
    pool.close()
    assert a.closed and b.closed and pool.all == []


def test_a_server_is_stopped_after_max_uses():
    pool = ServerPool(max_uses=2)
    a = pool.borrow("k", FakeServer)
    pool.give_back("k", a)
    assert pool.borrow("k", FakeServer) is a and not a.closed
    pool.give_back("k", a)  # second episode: worn out
    assert a.closed and a not in pool.all
    assert pool.borrow("k", FakeServer) is not a


def test_a_dead_server_is_never_handed_out_again():
    pool = ServerPool()
    a = pool.borrow("k", FakeServer)
    a.running = False  # died during the episode
    pool.give_back("k", a)
    assert a.closed and a not in pool.all
    b = pool.borrow("k", FakeServer)
    pool.give_back("k", b)
    b.running = False  # died while waiting in the pool
    c = pool.borrow("k", FakeServer)
    assert c is not b and b.closed and pool.all == [c]


def test_max_uses_must_be_positive():
    with pytest.raises(ValueError, match="max_uses"):
        ServerPool(max_uses=0)
