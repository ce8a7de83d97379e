"""Clean shutdown on SIGTERM/SIGINT (Slurm preemption, Ctrl-C): finish the step, save, exit 0;
a closed terminal's SIGHUP ignored (the run trains on); and no worker outlives its launcher.

The handler only records the signal (and ends a wait for a step's data: object_store.STOP_FETCHING,
which the step's read raises as FetchStopped, and the loop stops as after the step trained last; its
data loader's workers get a SIGTERM for theirs, as from a scheduler: loader.stop_workers_waiting).
After each step `should_stop()` lets every rank agree, since the scheduler may signal only some of
them and all ranks must take the same last step and write the same checkpoint: a MAX all-reduce of
one flag on a CPU (gloo) group of its own, which never waits for the GPU. A rank that is waiting for
data never reaches that collective, so a signalled rank also posts its stop in the job's c10d store,
for which a thread of every rank waits (`_await_stop`): there a stop ends the data waits as the
handler does (RV45a F2: every rank waiting on a hung store, a `kill` of one trainer saved only at
the end of data.fetch_timeout_s, 337 s later, with the data's error). Another thread (`_post`)
learns of its own rank's signal from the signal module's wakeup fd, not from the handler, which
cannot run while the main thread is blocked in the agreement's collective (RV46a F1: one rank in it,
another waiting for data). A second Ctrl-C (SIGINT after the first signal) stops the process at
once, without saving: one line on rank 0 and exit status 130 (128 + SIGINT, what a shell reports for
a Ctrl-C), no traceback. It exits from the handler (os._exit) rather than raising KeyboardInterrupt,
which would unwind through whatever the step was doing (a checkpoint write reports it as a failed
save, exit 2) and end in a traceback with exit status 1; what is cut short is safe to cut: a
checkpoint counts only once complete, the run lock is an flock the kernel releases, metrics.jsonl is
written a line at a time. Only in the interpreter's last teardown, after every atexit callback, has
Python given SIGINT its default action back: a second Ctrl-C there ends the process by the signal (a
shell says 130) with nothing left to save, and no line.

torchrun starts its workers in sessions of their own, so a SIGKILL of the launcher's process
group (a job scheduler, the OOM killer) leaves them training and writing checkpoints beside the
next resume. `exit_with_agent` makes each worker kill itself once torchrun's agent is gone
(training/contract/lifetime.py: a watchdog thread, not PR_SET_PDEATHSIG, which fires when the parent
*thread* that started the child ends, in torchrun not the agent's lifetime). The launcher's own
child (torchrun), started from its main thread, gets that signal (lifetime.signal_at_parent_death).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import os
import select
import signal
import socket
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from training.contract.errors import INTERRUPTED_EXIT
from training.contract.lifetime import AGENT_PID_VAR, exit_with, torchrun_worker
from training.contract.object_store import STOP_FETCHING
from training.data.loader import stop_workers_waiting

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_STOP_KEY = "gristmill/stop"  # in the default group's store: the signal's number, set by a signalled rank
# Set after a stop is posted, and by each rank as its loop ends: every rank's waiter waits for this key
# alone, so a loop's end wakes them without touching a posted stop (`set` wakes a waiter on both of
# TCPStore's servers; compare_set, on the older one, wakes none: review RV47a F2).
_WAKE = "wake"
# One wait per rank for the run, which the store's server answers when the key is set: no polling. A
# check four times a second per rank was ~40k requests a second at 10k ranks, about what one TCPStore
# server answers (review RV46a F5). A wait that does run out (after a week) is made again.
_AWAIT = timedelta(days=7)
_LOOK_S = 0.25  # how often the poster looks for its rank's signal where no wakeup fd wakes it (no request)
_RETRY_S = 1.0  # after a request to the store failed
_JOIN_S = 2.0  # how long the loop's end waits for each thread: a store that stopped answering leaves them
# GracefulStops made in this process, the same count on every rank (each run makes one): with torchrun's
# restart count, a stop's key names its run and attempt. The store outlives torchrun's restarts, and an
# earlier attempt's stop must not stop the next (review RV46a F2).
_MADE = itertools.count()
_WAKEUP: list[tuple[int, int]] = []  # the pipe a GracefulStop of this process has as the wakeup fd


def _no_wakeup_in_a_child() -> None:
    """A child forked from a trainer (its DataLoader workers) inherits the wakeup fd: its own signals
    (torch's terminate() of a slow worker at a loader's end) would post a stop for the whole job. After
    a fork the forking thread is the child's main thread, which may set it."""
    if _WAKEUP:
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        for fd in _WAKEUP.pop():
            with contextlib.suppress(OSError):
                os.close(fd)


os.register_at_fork(after_in_child=_no_wakeup_in_a_child)

# The stop's threads a loop's end left in a request to a store that stopped answering, with the store's
# peers as the default group's client sees it and the sockets the process had as their GracefulStop began
_LEFT: list[tuple[list[threading.Thread], _StorePeers | None]] = []


@dataclasses.dataclass(frozen=True)
class _StorePeers:
    port: int  # the TCPStore's
    addresses: frozenset  # (host, port) of the process's connections to it as the GracefulStop began
    before: frozenset  # "socket:[inode]" of the process's sockets then (the default client's among them)

    @classmethod
    def now(cls, store) -> _StorePeers | None:
        """The peers of the TCPStore under `store` (the default group's is a PrefixStore); None for
        another kind (a FileStore, a HashStore)."""
        while store is not None and not hasattr(store, "port"):
            store = getattr(store, "underlying_store", None)
        if store is None:
            return None
        sockets = _sockets()
        peers = {peer for fd in sockets if (peer := _peer(fd)) is not None and peer[1] == store.port}
        return cls(store.port, frozenset(peers), frozenset(sockets.values()))

    def shut_down_made_since(self) -> None:
        """Shut down the process's connections to the store made since `now` (by address where the
        default client's was seen then, else by port): a request in one fails at once."""
        for fd, link in _sockets().items():
            if link in self.before or (peer := _peer(fd)) is None:
                continue
            if peer in self.addresses if self.addresses else peer[1] == self.port:
                with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)  # the dup is the same socket


def _sockets() -> dict[int, str]:
    """{fd: "socket:[inode]"} of this process's open sockets ({} where /proc is not Linux's)."""
    found = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if (link := os.readlink(f"/proc/self/fd/{name}")).startswith("socket:"):
                    found[int(name)] = link
    return found


def _peer(fd: int) -> tuple[str, int] | None:
    """(host, port) that TCP socket `fd` is connected to; None for another kind, or one not connected."""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            return tuple(sock.getpeername()[:2])
    return None


@atexit.register
def _end_left() -> None:
    """End the threads a loop's end left in a request to the store, before the interpreter finalizes: the
    store's answer, or its server's end, reaching one then aborts the process ("terminate called without
    an active exception", SIGABRT, exit 134) after a run that completed (review RV47b F2: a store
    stalled across the loop's end, 6 of 6 trials). Their connections to the store, those made since
    their GracefulStop began, are shut down: their C++ requests fail at once and the threads return.
    (Waiting for the store instead kept each such rank up to 30 s, and a Ctrl-C in that wait, or an
    answer just after it, still aborted: review RV48a M1.) torch's C++ warning of each failed request,
    a 17-line stack after a complete run, goes to /dev/null meanwhile (milliseconds)."""
    left = [(threads, peers) for threads, peers in _LEFT if any(t.is_alive() for t in threads)]
    _LEFT.clear()
    if not left:
        return
    # A Ctrl-C here (SIGINT's default handler, after release()) raised in this callback and left them
    main = threading.current_thread() is threading.main_thread()
    sigint = signal.signal(signal.SIGINT, lambda *_: None) if main else None
    stderr = None
    try:
        with contextlib.suppress(OSError), open(os.devnull, "wb") as null:
            stderr = os.dup(2)
            os.dup2(null.fileno(), 2)
        for _, peers in left:
            if peers is not None:
                peers.shut_down_made_since()
        deadline = time.monotonic() + _JOIN_S
        for threads, _ in left:
            for thread in threads:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        if stderr is not None:
            os.dup2(stderr, 2)
            os.close(stderr)
        if main:
            signal.signal(signal.SIGINT, sigint)


class GracefulStop:
    def __init__(self, rank: int, world_size: int):
        self.received: int = 0  # the signal number, 0 while none arrived
        distributed = world_size > 1 and dist.is_initialized()
        self._store = distributed_c10d._get_default_store() if distributed else None
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self._stop_key = f"{_STOP_KEY}/{attempt}/{next(_MADE)}"
        self._wake_key = f"{self._stop_key}/{_WAKE}"
        self.group = dist.new_group(backend="gloo") if distributed else None
        self._watching: tuple[threading.Thread, threading.Thread, threading.Event] | None = None
        self._failing = False  # a request to the store failed: said once
        self._wakeup: tuple[int, int, int] | None = None  # (read end, write end, the previous wakeup fd)
        self.rank = rank
        self._previous: dict[int, object] = {}
        self._stderr: int | None = None  # a copy of fd 2 as the run started (__enter__)
        self._after: dict[int, object] = {}  # the handlers the note's replaced after the loop (release)
        self._store_peers: _StorePeers | None = None  # the store's connections as the threads started

    def __enter__(self) -> GracefulStop:
        STOP_FETCHING.clear()  # a run before this one in the process may have been stopped
        # The stderr the run started with, for the second Ctrl-C's line: an in-training eval points fd
        # 2 at its eval.log while it scores, and the line went there (review R18d 2c).
        with contextlib.suppress(OSError):
            self._stderr = os.dup(2)
        if threading.current_thread() is threading.main_thread():  # signal handlers live there only
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
            # A closed terminal (SIGHUP) only stops the printing (training/console.py): the run
            # trains on to its last step. Its default action ended the process, nothing saved.
            self._previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if self._store is not None and threading.current_thread() is threading.main_thread():
            # The signal's number, written by Python's C-level handler even while the main thread is
            # blocked in C (the agreement's gloo collective), where the Python handler runs only once
            # the collective returns: the watcher posts it from there (review RV46a F1)
            read, write = os.pipe()
            os.set_blocking(read, False)
            os.set_blocking(write, False)
            self._wakeup = (read, write, signal.set_wakeup_fd(write, warn_on_full_buffer=False))
            _WAKEUP.append((read, write))
        if self._store is not None:
            self._store_peers = _StorePeers.now(self._store)
            done = threading.Event()
            poster, waiter = (
                threading.Thread(target=run, args=(done,), name=f"gristmill-stop-{name}", daemon=True)
                for run, name in ((self._post, "post"), (self._await_stop, "wait"))
            )
            poster.start()
            waiter.start()
            self._watching = (poster, waiter, done)
        return self

    def __exit__(self, exc_type, *exc) -> None:
        # The loop done, its last step saved: a Ctrl-C or SIGTERM during what is left (the trackers'
        # finish, up to 30 s) is a note on every rank, not "interrupted", 130 or 143 for a complete run
        # (reviews R18f 4, R18g 1, R18i B3), until release(). Set before the threads' joins (up to 4 s
        # on a store that stopped answering), where the loop's handlers took a signal for one during it
        # (reviews RV47b F4, RV48a M3); the other handlers are restored after them, so that a signal
        # there is still the loop's handler's (the default one killed a rank whose loop failed, its
        # error unsaid: RV48b M1).
        stopping = self.received  # a signal during the joins below is none of the loop's
        # A torchrun worker (a process of its own) keeps the note's handlers after a stop's save too: a
        # job's SIGTERM reaches each process in its own time, and one in this rank's teardown killed it,
        # 143 after a clean save (trial RV58a F1)
        if exc_type is None and (not stopping or torchrun_worker()):  # complete, or stopped and saved
            for sig in _SIGNALS:
                if sig in self._previous:
                    self._after[sig] = self._previous.pop(sig)
                    signal.signal(sig, self._after_loop)
        try:
            self._end_watching()
        finally:
            for sig, handler in self._previous.items():
                # Stopping on a signal: a second Ctrl-C during what is left (the interpreter's exit, its
                # atexit work) still stops at once, 130 and one line; restored, it met an atexit
                # callback (a traceback, exit 0) when the first one's save was quick.
                if not (sig == signal.SIGINT and stopping):
                    signal.signal(sig, handler)
            self._previous.clear()
            STOP_FETCHING.clear()
            if self._stderr is not None:
                with contextlib.suppress(OSError):
                    os.close(self._stderr)
                self._stderr = None

    def _end_watching(self) -> None:
        """End the stop's threads and give the wakeup fd back. Not by a request of the main thread's: a
        store that stopped answering would hold the run's end (a clone's handshake and compare_set
        ignore set_timeout: RV47a F1). Threads still in a request after their joins are left, daemon
        threads that the process's exit ends (_end_left)."""
        if self._watching is None:
            return
        poster, waiter, done = self._watching
        self._watching = None
        done.set()
        if self._wakeup is not None:  # the poster, in its select, releases the waiters now
            with contextlib.suppress(OSError):
                os.write(self._wakeup[1], b"\0")
        try:
            poster.join(timeout=_JOIN_S)
            waiter.join(timeout=_JOIN_S)
        finally:
            if left := [t for t in (poster, waiter) if t.is_alive()]:
                _LEFT.append((left, self._store_peers))
            if self._wakeup is not None:
                read, write, previous = self._wakeup
                signal.set_wakeup_fd(previous)
                _WAKEUP.clear()
                if not poster.is_alive():  # else left open: a number given again would be read
                    os.close(read)
                    os.close(write)
                self._wakeup = None

    def release(self) -> None:
        """The run's records written (or failed): SIGINT and SIGTERM as they were before the run, so an
        in-process caller (the demo, the mixture search's workers, a test) gets them back; called in a
        `finally` (an error after the loop left the note's handler in place: R18i A2). A torchrun
        worker, a process of its own, keeps the note's: given back, a SIGTERM in its teardown (the
        process group's, seconds) killed a complete rank, 143 (trial RV58a F1)."""
        for sig, handler in self._after.items():
            if signal.getsignal(sig) == self._after_loop and not torchrun_worker():
                signal.signal(sig, handler)
        self._after.clear()

    def _after_loop(self, signum: int, frame) -> None:
        if self.received and signum == signal.SIGINT:
            self._stop_now(complete=True)
        self.received = self.received or signum
        if self.rank == 0:
            name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            with contextlib.suppress(OSError):
                note = f"note: {name} after the last step: the run finishes its records (a second Ctrl-C "
                os.write(2, f"{note}stops at once)\n".encode())

    def _handle(self, signum: int, frame) -> None:
        if self.received and signum == signal.SIGINT:
            self._stop_now()
        # the first signal is the stop's: a SIGTERM taken with a Ctrl-C (Python runs SIGINT's handler
        # first) wrote over it (trial RV58a F5)
        self.received = self.received or signum
        _end_data_waits()

    def _client(self):
        """A client of the job's store for the calling thread alone: a TCPStore client makes one request at
        a time, and the waiter's lasts the run (the main thread's requests must not queue behind it)."""
        return self._store.clone()

    def _store_failed(self, e: Exception) -> None:
        """Said once: the first line of the store's error (not torch's ~25 lines of C++ frames), and not
        at all when the job's agent, which hosts the store, is gone: the watchdog (exit_with_agent) ends
        this process within a moment, and the warning described nothing that happened (trial RV55b 2)."""
        if not self._failing and not _agent_gone():
            self._failing = True
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            line = f"warning: rank {self.rank}: the job's store did not answer the stop's watcher ({first}); "
            line += "a stop that reaches one rank alone may wait for the next step\n"
            with contextlib.suppress(OSError):
                os.write(2, line.encode())

    def _post(self, done: threading.Event) -> None:
        """Until the loop ends: post this rank's signal in the store as it arrives, from the wakeup fd; not
        from the handler: the store may hang, and the handler runs on the main thread. Then, the loop
        ended, release every rank's waiter: a thread still blocked in the store's C++ wait as the
        interpreter exits aborts the process (SIGABRT, exit 134) if the server goes meanwhile. A failed
        request is said once and made again on a new client."""
        wakeup, pending, posted, store = self._wakeup, 0, False, None
        with contextlib.suppress(Exception):  # made at the start: no burst of connections at a stop
            store = self._client()
        while not done.is_set():
            if wakeup is None:
                done.wait(_LOOK_S)
            elif select.select([wakeup[0]], [], [], _LOOK_S)[0]:
                # Read whatever is there, a signal after the first too: bytes left in the pipe made the
                # select return at once, a core spun until the loop's end (review RV47b F1)
                with contextlib.suppress(OSError):  # BlockingIOError: another read took them
                    got = os.read(wakeup[0], 64)
                    pending = pending or next((b for b in got if b in _SIGNALS), 0)
            pending = pending or self.received
            if not pending or posted or done.is_set():
                continue
            try:
                store = store or self._client()
                store.set(self._stop_key, str(pending))
                store.set(self._wake_key, _WAKE)
                posted = True
            except Exception as e:  # the store's timeout, a reset connection: made again
                store = None
                self._store_failed(e)
        with contextlib.suppress(Exception):
            (store or self._client()).set(self._wake_key, _WAKE)

    def _await_stop(self, done: threading.Event) -> None:
        """Until the loop ends: wait in the store for a rank's stop, then end this rank's data waits, as
        should_stop does for a stop it learns of. The agreement after the step or at the step's read then
        stops every rank together. A wake with no stop posted is a rank's loop ending."""
        store = None
        while not done.is_set():
            asked = time.monotonic()
            try:
                store = store or self._client()
                store.wait([self._wake_key], _AWAIT)
                stopped = store.check([self._stop_key])
            except Exception as e:  # a week's wait run out: made again; else said once, made again
                store = None
                if time.monotonic() - asked < _AWAIT.total_seconds() and not done.is_set():
                    self._store_failed(e)
                    done.wait(_RETRY_S)
                continue
            if stopped and not done.is_set() and not STOP_FETCHING.is_set():
                _end_data_waits()
            return

    def _stop_now(self, complete: bool = False) -> None:
        """The second Ctrl-C: one line (rank 0; every rank gets the signal) and out, saving nothing
        (`complete`: after the last step, whose checkpoint is saved: nothing to resume, R18i B4)."""
        if self.rank == 0:
            first = signal.Signals(self.received).name
            what = "second Ctrl-C (SIGINT)" if first == "SIGINT" else f"SIGINT after {first}"
            line = (
                f"{what} after the last step: stopping now; the run's steps and checkpoints are complete "
                "(its trackers may lack their last rows)\n"
                if complete
                else f"{what}: stopping now without saving; resume from the newest complete checkpoint with "
                "--resume auto\n"
            )
            with contextlib.suppress(OSError):  # not sys.stderr: the step may be inside one of its writes
                os.write(2 if self._stderr is None else self._stderr, line.encode())
        with contextlib.suppress(Exception):  # the step may hold stdout's lock (a reentrant flush raises)
            sys.stdout.flush()
        os._exit(INTERRUPTED_EXIT)

    def failed_ranks(self, message: str | None) -> list[tuple[int, str]]:
        """(rank, message) of every rank whose `message` is not None, the same on every rank: a MAX
        all-reduce of one flag at every call, and the messages gathered only when some rank has one
        (collectives on the stop's gloo group when distributed). A rank's own error reaches rank 0,
        which alone prints errors (a placeholder in its place named no shard: review R24c F2)."""
        if self.group is None:
            return [] if message is None else [(0, message)]
        if not any_rank(message is not None, self.group):
            return []
        messages: list[str | None] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(messages, message, group=self.group)
        return [(rank, m) for rank, m in enumerate(messages) if m is not None]

    def should_stop(self) -> str | None:
        """The signal's name on every rank if any rank received one (a collective when distributed). A
        rank that learns of the stop here, not from a signal of its own, ends its waits for data as its
        handler would: its prefetcher and its loader's workers kept retrying through an outage, and its
        process outlived the save by the rest of data.fetch_timeout_s (RV44a F1)."""
        signum = self.received
        if self.group is not None:
            t = torch.tensor([signum], dtype=torch.int32)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
            signum = int(t.item())
        if signum and not self.received and not STOP_FETCHING.is_set():
            _end_data_waits()
        return signal.Signals(signum).name if signum else None


def _end_data_waits() -> None:
    """A stop asked of this rank or learned of: a wait for a step's data ends (the step trained last is
    saved now), and so do its data loader's workers' waits, where the signal was the trainer's alone."""
    STOP_FETCHING.set()
    stop_workers_waiting()


def any_rank(flag: bool, group=None, device: torch.device | None = None) -> bool:
    """Whether `flag` holds on any rank: a MAX all-reduce on `group` (None: the default group, whose
    NCCL takes its tensors on the GPU: `device`). Every rank must call it."""
    t = torch.tensor([int(flag)], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(t.item())


def exit_with_parent(forked_by: int | None = None) -> None:
    """Kill this process (SIGKILL: nothing more is written) within a moment of its parent's death;
    `forked_by`: the parent's pid, when the parent could pass it (lifetime.exit_with)."""
    exit_with(forked_by=forked_by)


def _agent_gone() -> bool:
    """Whether this torchrun worker's agent (lifetime.AGENT_PID_VAR, under `gristmill train`) has ended;
    False where none is named (a torchrun started by hand)."""
    agent = os.environ.get(AGENT_PID_VAR, "")
    if not agent.isdigit():
        return False
    try:
        with open(f"/proc/{agent}/stat") as f:  # a zombie is gone too (kill(pid, 0) succeeds on it)
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def exit_with_agent() -> None:
    """A torchrun worker's watchdog: kill this process within a moment of its torchrun agent's death.
    Under `gristmill train` the agent gives its pid (lifetime.AGENT_PID_VAR), watched through a pidfd:
    an agent that died during this worker's first seconds of imports ends it at once, where a watch of
    the parent found now would watch the reaper, and the worker would wait on the dead agent's store
    until torch's timeout (review RV34f M1). A torchrun started by hand gives none: the parent."""
    agent = os.environ.get(AGENT_PID_VAR)
    if agent:
        exit_with(int(agent))
    else:
        exit_with()
