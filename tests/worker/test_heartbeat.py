"""Heartbeats count a worker only while its task consumer is live (what /readyz and /targets show)."""

from __future__ import annotations

from harness import fast_settings

from autofusion_core.queue import JobQueue
from autofusion_core.store import open_store
from autofusion_worker.consumer import ConsumerWatch
from autofusion_worker.heartbeat import Heartbeat


def test_heartbeat_follows_the_consumer(tmp_path) -> None:
    settings = fast_settings(tmp_path)
    store, queue, watch = open_store(settings), JobQueue(settings), ConsumerWatch()
    heartbeat = Heartbeat(settings, store, queue, "w1", ["cpu"], 1, watch=watch)
    try:
        heartbeat.beat()
        assert store.workers() == []  # not consuming yet: not ready
        watch.started(object())
        heartbeat.beat()
        assert [w.id for w in store.workers()] == ["w1"]
        watch.stopped()  # the consumer lost its connection: withdrawn at once, not after the TTL
        heartbeat.beat()
        assert store.workers() == []
        watch.started(object())
        assert not watch.reconnect("test")  # no event loop to ask (the embedded file broker)
        assert watch.live
    finally:
        queue.close()
        store.close()
