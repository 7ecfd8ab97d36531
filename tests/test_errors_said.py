"""No error is swallowed: a shutdown step that fails, a kernel build that fails and a peer that
cannot be reached are each logged with their reason, and retries wait a bounded time."""

import logging
import threading
import time

import torch

from minillm.core.block_manager import BlockManager
from minillm.core.kv_cache import PagedKVCache
from minillm.core.scheduler import Scheduler
from minillm.engine import kv_transfer
from minillm.engine.executor import within
from minillm.kernels import cpu_decoder


def test_within_says_why_a_step_failed_or_hung(caplog):
    def broken():
        raise RuntimeError("the group is gone")

    caplog.set_level(logging.WARNING, logger="minillm")
    assert within(5, lambda: None)
    assert not within(5, broken)
    assert "RuntimeError: the group is gone" in caplog.text
    release = threading.Event()
    assert not within(0.05, release.wait)
    assert "did not return within" in caplog.text
    release.set()


def test_a_failed_decoder_build_is_reported_with_its_reason(monkeypatch, caplog):
    def no_compiler():
        raise RuntimeError("Error building extension 'cpu_decoder': g++ not found")

    monkeypatch.setattr(cpu_decoder, "load_decoder_kernels", no_compiler)
    assert not cpu_decoder.decoder_kernels_available()
    assert "g++ not found" in caplog.text


def _producer(monkeypatch, error: Exception):
    "A KV producer whose every try to reach its consumer raises `error`, counted."
    monkeypatch.setattr(kv_transfer, "RECONNECT_MAX", 0.01)  # retry at once: many tries, quickly
    cache = PagedKVCache(1, 4, 4, 1, 8, dtype=torch.float32)
    producer = kv_transfer.KVProducer(cache, Scheduler(BlockManager(4, 4)), "127.0.0.1:1", "s")
    tries = []

    def connect():
        tries.append(1)
        raise error

    monkeypatch.setattr(producer.link, "connect", connect)
    return producer, tries


def _wait(condition, seconds: float = 60):
    "Poll until `condition()` holds; a loaded machine may be slow, so the bound is generous."
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_producer_without_its_consumer_retries_and_says_so_once_a_minute(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="minillm.kv_transfer")
    producer, tries = _producer(monkeypatch, ConnectionRefusedError("refused"))
    producer.start()
    _wait(lambda: len(tries) >= 5)
    producer.close()
    assert len(tries) >= 5 and not producer._thread.is_alive()
    said = [r.getMessage() for r in caplog.records if "cannot reach" in r.getMessage()]
    assert len(said) == 1, said  # the first failure, then once a minute
    assert "ConnectionRefusedError: refused" in said[0]


def test_a_producer_stops_on_an_error_that_is_not_the_networks(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="minillm.kv_transfer")
    producer, tries = _producer(monkeypatch, ValueError("a bug"))
    producer.start()
    _wait(lambda: not producer._thread.is_alive())
    assert len(tries) == 1 and not producer._thread.is_alive()
    assert "ValueError: a bug" in caplog.text
