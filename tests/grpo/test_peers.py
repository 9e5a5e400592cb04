"""The heartbeat every training process sends and reads (``bridges.grpo.peers``), over a real TCP store: which
peer stopped, which failed and with what, a peer that finished is never waited for, and a store that is gone
is said as that. The watchers here never end the test process (``peer_timeout_s`` of an hour): what is
tested is the sentence ``explain`` gives after a collective failed, within a few beats."""

from __future__ import annotations

import datetime
import json
import socket
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from bridges.grpo.parallel import World
from bridges.grpo.peers import DEAD_AFTER_BEATS, PeerWatch, watched
from bridges.runtime.errors import ConfigError
from bridges.runtime.launch import record_for_launcher

PERIOD = 0.05
HOUR = 3600.0


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=5))
    yield server


def watches(store, size: int = 2, timeout_s: float = HOUR, ended: list[str] | None = None) -> list[PeerWatch]:
    """``size`` processes' watchers in this one; what a watcher would end its process with goes to ``ended``."""
    def client(rank: int) -> PeerWatch:
        connection = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=datetime.timedelta(seconds=1))
        return PeerWatch(World(rank, size), timeout_s, dist.PrefixStore("t", connection), f"127.0.0.1:{store.port}",
                         PERIOD, end=lambda watch, said: (ended if ended is not None else []).append(f"{watch.world.rank}: {said}"))
    return [client(rank) for rank in range(size)]


def test_the_watcher_ends_its_process_on_a_peer_silent_for_peer_timeout_s_or_failed(store):
    ended: list[str] = []
    first, second, third = watches(store, 3, timeout_s=0.5, ended=ended)
    third.report("generating the rollouts of step 2")
    time.sleep(PERIOD * 3)
    third.close()  # silent from now on (a SIGSTOP)
    started = time.monotonic()
    while len(ended) < 2 and time.monotonic() - started < 5:
        time.sleep(PERIOD)
    waited = time.monotonic() - started
    assert 0.5 <= waited < 3
    assert sorted(e.split(" (pid")[0] for e in ended) == [
        f"0: training process 2 of 3 on {socket.gethostname()}", f"1: training process 2 of 3 on {socket.gethostname()}"]
    assert all("stopped answering while generating the rollouts of step 2" in e for e in ended)
    first.close(), second.close()


def test_a_peer_that_stops_beating_is_named_with_what_it_was_doing(store):
    first, second = watches(store)
    second.report("training step 7")
    time.sleep(PERIOD * 4)
    second.close()
    started = time.monotonic()
    said = first.explain()
    assert said is not None and time.monotonic() - started < (DEAD_AFTER_BEATS + 2) * PERIOD + 1
    assert said.startswith(f"training process 1 of 2 on {socket.gethostname()} (pid ")
    assert "stopped answering while training step 7 (" in said and said.endswith(
        "the other processes stopped too, and resume=true continues from the newest checkpoint.")
    first.close()


def test_every_peer_alive_means_the_error_was_this_process_own(store):
    first, second = watches(store)
    time.sleep(PERIOD * 3)
    assert first.explain() is None  # after (DEAD_AFTER_BEATS + 1) beats: re-raised as it is
    first.close(), second.close()


def test_a_peer_that_failed_is_quoted(store):
    first, second = watches(store)
    second.report("sending the weights of step 3 to the engine")
    second.fail("CUDA out of memory.")
    said = first.explain()
    assert said is not None and said.startswith("training process 1 of 2 on ")
    assert "failed while sending the weights of step 3 to the engine: CUDA out of memory; the other" in said
    first.close(), second.close()


def test_a_peer_that_finished_is_never_waited_for(store):
    ended: list[str] = []
    first, second = watches(store, timeout_s=0.3, ended=ended)
    time.sleep(PERIOD * 3)
    second.close(finished=True)
    time.sleep(1.0)  # past peer_timeout_s
    assert first.explain() is None and ended == []
    first.close()


def test_a_store_that_is_gone_is_said_as_that():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
    first, second = watches(server)
    time.sleep(PERIOD * 3)
    del server  # the first node's launcher stopped
    said = first.explain()
    assert said is not None and "lost the rendezvous store at 127.0.0.1:" in said, said
    first.close(), second.close()


def test_watched_publishes_this_process_error_and_names_the_peer_after_a_collective_failed(store):
    first, second = watches(store)
    with pytest.raises(ConfigError, match="bad value"), watched(second):
        raise ConfigError("bad value.")
    assert json.loads(first._store.get("beat/1"))["failed"] == "bad value."
    with pytest.raises(Exception, match="training process 1 of 2 .* failed while starting: bad value"), watched(first):
        raise RuntimeError("[pair.cc:537] Read error: Connection reset by peer")


def test_torchruns_failure_block_quotes_the_error_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    record_for_launcher("training process 1 of 2 on node-b (pid 7) stopped answering while training step 3.")
    failure = ProcessFailure(local_rank=0, pid=7, exitcode=2, error_file=str(error_file))
    assert failure.message["extraInfo"]["py_callstack"] == (
        "training process 1 of 2 on node-b (pid 7) stopped answering while training step 3.")


def test_under_max_restarts_every_worker_continues_the_run_and_overwrite_is_refused(monkeypatch: pytest.MonkeyPatch):
    from bridges.jobs.train import continued_under_restarts
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig

    assert continued_under_restarts(parse_config(TrainConfig, [])).resume is False  # no torchrun restarts
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")  # the other nodes' workers start again with 0
    assert continued_under_restarts(parse_config(TrainConfig, [])).resume is True
    with pytest.raises(ConfigError, match=r"^overwrite=true under torchrun --max-restarts would empty the run folder"):
        continued_under_restarts(parse_config(TrainConfig, ["overwrite=true"]))


def test_our_launcher_points_at_the_sentence_a_process_printed(tmp_path: Path):
    from bridges.runtime.launch import ProcessFailedError, launch

    with pytest.raises(ProcessFailedError, match=r"^training process \d of 2 ended with the error above, so the"):
        launch("json.tool", ["--no-such-option"], 2, tmp_path)  # argparse: one line, exit 2
