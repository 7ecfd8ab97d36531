"""No error is swallowed: a shutdown step that fails, a kernel build that fails and a peer that
cannot be reached are each logged with their reason, and retries wait a bounded time."""

import logging
import threading
import time

import torch

from minillm.bench.online import free_port
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


def test_a_producer_without_its_consumer_retries_with_bounded_waits_and_says_so(caplog):
    caplog.set_level(logging.WARNING, logger="minillm.kv_transfer")
    cache = PagedKVCache(1, 4, 4, 1, 8, dtype=torch.float32)
    scheduler = Scheduler(BlockManager(4, 4))
    producer = kv_transfer.KVProducer(cache, scheduler, f"127.0.0.1:{free_port()}", "s", 0.2)
    producer.start()
    time.sleep(1.5)
    producer.close()
    assert not producer._thread.is_alive()
    said = [r.getMessage() for r in caplog.records if "cannot reach the consumer" in r.getMessage()]
    assert len(said) == 1, said  # the first failure, then once a minute
    assert kv_transfer.RECONNECT_MAX <= 10
