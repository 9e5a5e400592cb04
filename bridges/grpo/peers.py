"""Every training process knows, within a stated bound, when another one stops, and the run ends with one
sentence naming it: which process, on which machine, doing what.

Why a heartbeat and not the collectives' own errors: gloo notices a peer that died at once (its socket
closes) but says only "Connection reset by peer", and it never notices one that is stopped (SIGSTOP, a
frozen machine, a partitioned network); NCCL notices neither until its collective timeout (10 minutes).
So each process beats once a second into the launcher's rendezvous store (the TCP store at
``MASTER_ADDR:MASTER_PORT`` that torchrun, ``accelerate launch`` and ``trainer.num_processes`` all start)
from a thread of its own — a long step never looks like a hang — with its host, pid and what it is doing,
and reads the others' beats:

- a peer silent for ``trainer.peer_timeout_s`` (or that never beat) ends this process with the sentence.
  The main thread may be blocked in a collective that will never finish, so the watcher exits the process
  itself (exit 2): checkpoints are written whole or not at all, and the processes it started die with it
  (``die_with_parent``). Under torchrun the sentence is also the error file its failure block quotes.
- a peer that failed with its own error publishes the sentence in its last beat; the others quote it.
- after a collective raised here (gloo's "Connection reset"), ``explain`` waits a few beats for the peer
  that stopped beating and names it; an error of this process's own is re-raised as it is.
- the store itself gone for ``peer_timeout_s`` (it lives in the first node's launcher, or in rank 0 under
  ``trainer.num_processes``) is said as that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from bridges.grpo.parallel import World, launcher_store
from bridges.runtime.errors import BridgesError
from bridges.runtime.launch import record_for_launcher

BEAT_PERIOD_S = 1.0
DEAD_AFTER_BEATS = 3  # once a collective failed: a peer this many beats silent is the one that stopped
RESUME = "the other processes stopped too, and resume=true continues from the newest checkpoint."
FINISHED = "finished"  # a peer's last beat once it left the run normally: never waited for again


class PeerFailedError(BridgesError):
    """Another training process stopped (died, hung, or failed with its own error); this one stopped too."""


@dataclasses.dataclass(frozen=True)
class Beat:
    """What one process last said of itself."""

    host: str
    pid: int
    doing: str
    count: int
    failed: str = ""


class PeerWatch:
    """This process's beat out and the others' in (``start``: None for one process)."""

    def __init__(self, world: World, timeout_s: float, store: Any, where: str, period_s: float = BEAT_PERIOD_S,
                 end: Callable[[PeerWatch, str], None] | None = None):
        self.world, self.timeout_s, self.period_s, self.where = world, timeout_s, period_s, where
        self._end = end or end_process
        self._store = store
        self._doing, self._failed, self._count = "starting", "", 0
        self._changed = threading.Condition()
        now = time.monotonic()
        self._seen: dict[int, tuple[Beat | None, float]] = {r: (None, now) for r in self._others()}
        self._store_lost_since: float | None = None
        self._explaining = False
        self._stop, self._wake = threading.Event(), threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._run, name="bridges-peer-watch", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, world: World, timeout_s: float) -> PeerWatch | None:
        """Connect to the launcher's store as one more client (its own connection: the process group's is
        not shared across threads) and start beating; None for one process."""
        if not world.distributed:
            return None
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        timeout = datetime.timedelta(seconds=max(1.0, min(timeout_s, 10.0)))
        store, where = launcher_store(timeout, f"bridges-peers/{restart}")
        return cls(world, timeout_s, store, where)

    def report(self, doing: str) -> None:
        """What this process is doing now, for the sentence another one prints if this one stops (sent at
        once, by the watcher's thread: steps can be shorter than a beat)."""
        self._doing = doing
        self._wake.set()

    def fail(self, sentence: str) -> None:
        """This process's own error, in its last beat, for the others to quote; from here on the error is
        this process's to report, so its watcher no longer ends it."""
        self._failed, self._explaining = sentence, True
        with contextlib.suppress(Exception):  # the store may be what failed; the others then time out on this one
            self._beat()

    def close(self, finished: bool = False) -> None:
        """Stop beating; ``finished``: first say so, so no peer takes this one's silence for a hang."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=self.period_s * 2)
        if finished:
            self._doing = FINISHED
            with contextlib.suppress(Exception):
                self._beat()

    def explain(self) -> str | None:
        """After a collective failed in this process: the sentence naming the peer that stopped, once its
        beats say so (a few beats at most), or None when every peer is alive (the error was this one's)."""
        self._explaining = True
        deadline = time.monotonic() + (DEAD_AFTER_BEATS + 1) * self.period_s
        with self._changed:
            while (verdict := self._store_verdict(0.0) or self._verdict(DEAD_AFTER_BEATS * self.period_s)) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)
        return verdict

    def _others(self) -> list[int]:
        return [r for r in range(self.world.size) if r != self.world.rank]

    def _beat(self) -> None:
        self._count += 1
        beat = Beat(socket.gethostname(), os.getpid(), self._doing, self._count, self._failed)
        self._store.set(f"beat/{self.world.rank}", json.dumps(dataclasses.asdict(beat)))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.period_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            verdict = self._look()
            if verdict is not None and not self._explaining:
                self._explaining = True
                self._end(self, verdict)

    def _look(self) -> str | None:
        """One beat out and the others' in; the sentence that ends the run, if one does."""
        now = time.monotonic()
        try:
            self._beat()
            keys = [f"beat/{r}" for r in self._others()]
            present = [k for k in keys if self._store.check([k])]
            beats = dict(zip(present, self._store.multi_get(present) if present else [], strict=True))
        except Exception:
            with self._changed:
                self._store_lost_since = self._store_lost_since or now
                self._changed.notify_all()
                return self._store_verdict(self.timeout_s)
        with self._changed:
            self._store_lost_since = None
            for rank in self._others():
                raw = beats.get(f"beat/{rank}")
                beat = Beat(**json.loads(raw)) if raw is not None else None
                last = self._seen[rank][0]
                if beat is not None and (last is None or beat.count != last.count):
                    self._seen[rank] = (beat, now)
            self._changed.notify_all()
            return self._verdict(self.timeout_s)

    def _store_verdict(self, lost_for: float) -> str | None:
        """The sentence once the store has not answered for ``lost_for`` s: the machine holding it is gone."""
        if self._store_lost_since is None or time.monotonic() - self._store_lost_since < lost_for:
            return None
        return (f"training process {self.world.rank} of {self.world.size} lost the rendezvous store at {self.where}: "
                f"the launcher of the first node (or process 0 under trainer.num_processes) stopped or cannot be "
                f"reached; {RESUME}")

    def _verdict(self, silent_after: float) -> str | None:
        """The sentence for the first peer that failed, or that has not beaten for ``silent_after`` s."""
        now, size = time.monotonic(), self.world.size
        for rank, (beat, _) in sorted(self._seen.items()):
            if beat is not None and beat.failed:
                return f"training process {rank} of {size} on {beat.host} (pid {beat.pid}) failed while " \
                       f"{beat.doing}: {beat.failed.rstrip('.')}; {RESUME}"
        for rank, (beat, since) in sorted(self._seen.items()):
            if now - since < silent_after or beat is not None and beat.doing == FINISHED:
                continue
            if beat is None:
                return (f"training process {rank} of {size} never reported within {now - since:.0f} s (its node "
                        f"did not start, or cannot reach {self.where}); {RESUME}")
            return (f"training process {rank} of {size} on {beat.host} (pid {beat.pid}) stopped answering while "
                    f"{beat.doing} ({now - since:.0f} s without a beat: killed, hung or its machine gone); {RESUME}")
        return None

    def speaks(self) -> bool:
        """Whether this process prints the sentence: the lowest-numbered live process on its machine, so
        each machine's terminal shows it once."""
        here = socket.gethostname()
        live_here = [r for r, (beat, since) in self._seen.items()
                     if beat is not None and beat.host == here and not beat.failed
                     and time.monotonic() - since < DEAD_AFTER_BEATS * self.period_s]
        return all(self.world.rank < r for r in live_here)


def end_process(watch: PeerWatch, sentence: str) -> None:
    """What the watcher does with its verdict: the main thread may be inside a collective that never returns,
    so this process ends here, with the sentence (once per machine) and exit code 2."""
    record_for_launcher(sentence)
    if watch.speaks():
        print(f"error: {sentence}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(2)


@contextlib.contextmanager
def watched(watch: PeerWatch | None) -> Iterator[None]:
    """The run inside: an error of this process's own is published for the others and raised as it is; a
    collective that failed because a peer stopped becomes the one sentence naming that peer (printed once
    per machine: the other processes there exit 2 quietly)."""
    if watch is None:
        yield
        return
    finished = False
    try:
        yield
        finished = True
    except BridgesError as exc:
        watch.fail(str(exc))
        raise
    except Exception as exc:
        verdict = watch.explain()
        if verdict is None:
            watch.fail(f"{type(exc).__name__}: {exc}")
            raise
        if watch.speaks():
            raise PeerFailedError(verdict) from None  # run_cli prints it and records it for the launcher
        record_for_launcher(verdict)
        raise SystemExit(2) from None
    finally:
        watch.close(finished)
