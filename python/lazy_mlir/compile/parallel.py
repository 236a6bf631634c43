"""A graph's fusion groups compile side by side (``Config.compile_workers``).

A step whose groups are split by ops kept in TorchScript (dropout's random
draws, host reads) has several groups, each compiled at its first run: one
after the other, in this process, while Inductor's compile is mostly
single-threaded Python. Instead, during a graph's first execution, each of
its groups that must be compiled runs its TorchScript subgraph (eager's
numerics, counted as an interpreted call) and leaves its compile here. After
the graph's last group ran, ``flush`` generates their code at once: here,
the largest first, and in ``compile_workers`` worker processes
(``compile_worker``) for the rest. Each group was lowered to FX in the step
(TS -> FX -> MLIR passes -> FX: a few percent of a compile), which gives the
layouts of the outputs its code will return; its TorchScript runs return
those layouts too, so the groups after it are compiled for the inputs they
will get from generated code. The step waits for all of them, as it would
have for the compiles one by one; the next step runs the generated code.

A graph with one group, a compile that is not static (shape-generic ones
plan from the sizes seen so far), other code generators than Inductor,
dumps on, and distributed runs (their groups hold collectives, and ranks
share compiles through the cache folder instead) compile in the step as
before. A worker that fails a group, or dies, hands it back to this
process, whose compile reports any error as every compile does.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import Connection

import torch

from .. import config
from ..cluster import layer_groups
from ..observe import progress
from . import background

# A worker takes ~8 s to import torch and Inductor: it is started only when
# the groups but the largest hold at least this many ops (GPT-2's smallest
# groups, 12-35 ops, compile in 2-10 s each).
MIN_OPS_FOR_WORKERS = 30
# Seconds a worker may take to import torch and Inductor before it is given up.
START_TIMEOUT = 120.0


def input_layout(t: torch.Tensor) -> tuple:
    """What the worker needs of an input: a tensor of the same layout (the
    code is compiled for layouts, not values; baked-in scalar values were
    already baked into the graph by our passes)."""
    return tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype, str(t.device)


class WorkerProcess:
    """One ``compile_worker`` process: ``compile`` blocks (without the GIL)
    until it replies. A fresh interpreter, never a fork: a fork of a process
    running LTC's and Inductor's threads can deadlock, and multiprocessing's
    spawn would run a user script without a main guard again."""

    def __init__(self):
        jobs_read, jobs_write = os.pipe()
        replies_read, replies_write = os.pipe()
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # above lazy_mlir/
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lazy_mlir.compile.worker", str(jobs_read), str(replies_write)],
            pass_fds=(jobs_read, replies_write), stdin=subprocess.DEVNULL, env=env)
        os.close(jobs_read)
        os.close(replies_write)
        self.jobs = Connection(jobs_write, readable=False)
        self.replies = Connection(replies_read, writable=False)
        self.ready = False
        self.alive = True

    def wait_ready(self, timeout: float = START_TIMEOUT) -> bool:
        """Whether the worker started (False also once it is stopped)."""
        try:
            self.ready = self.replies.poll(timeout) and self.replies.recv() == ("ready",)
        except (EOFError, OSError):
            self.ready = False
        self.alive = self.ready
        return self.ready

    def compile(self, name: str, graph: bytes, inputs: dict, cpp_wrapper: bool = False,
                probe: bool = False) -> tuple:
        """("done", artefact bytes, seconds, native plan or None) or ("failed", why).
        ``inputs``: ``isolated_compile.input_message``'s. ``probe``: the code
        is run once on the blank inputs for its native plan."""
        return self.send({"name": name, "graph": graph, "inputs": inputs, "cpp_wrapper": cpp_wrapper, "probe": probe})

    def send(self, job: dict) -> tuple:
        """The worker's reply to ``job``; ("exited", why) when it died."""
        try:
            self.jobs.send(job)
            return self.replies.recv()
        except (EOFError, OSError) as exc:
            self.alive = False
            return ("exited", f"the compile worker exited ({type(exc).__name__}: {exc})")

    def stop(self) -> None:
        """Ends the worker (idle: it reads the end of its jobs; still
        importing: killed). A thread in ``wait_ready`` then returns False."""
        self.alive = False
        self.jobs.close()
        if not self.ready:
            self.process.kill()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def close(self) -> None:
        """After ``stop``, once no thread reads its replies."""
        self.replies.close()


@dataclasses.dataclass
class _Graph:
    groups: int = 0                   # groups bound into the graph
    first_runs: int = 0               # of those, how many ran once
    jobs: list = dataclasses.field(default_factory=list)


_graphs: dict[str, _Graph] = {}
_lock = threading.Lock()


def graph_of(group_name: str) -> str:
    """'graph3.g1' -> 'graph3' (lazy_backend/core/group_binder.cpp names them so)."""
    return group_name.rsplit(".g", 1)[0]


def bound(group_name: str) -> None:
    """A group of the graph was bound (before the graph's first execution)."""
    with _lock:
        _graphs.setdefault(graph_of(group_name), _Graph()).groups += 1


def applies(group_name: str, cfg: config.Config) -> bool:
    """Whether the group's compile may wait for the end of its graph's first
    execution, to run beside the other groups'."""
    if cfg.compile_workers <= 0 or cfg.level != "O1" or cfg.codegen != "inductor" or cfg.dump_dir:
        return False
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    graph = _graphs.get(graph_of(group_name))
    return graph is not None and graph.groups >= 2 and graph.first_runs < graph.groups


def job_for(group_name: str, key: str):
    """The job deferred in the group's graph for the same cache key, if any."""
    with _lock:
        return next((job for job in _graphs[graph_of(group_name)].jobs if job.key == key), None)


def defer(group_name: str, job) -> Future:
    """Queues ``job`` (a ``deferred.DeferredCompile``, prepared or
    following another) for the graph's flush; its future gets the group's
    LoweredGroup, or None (failed)."""
    future: Future = Future()
    job.future = future
    with _lock:
        _graphs[graph_of(group_name)].jobs.append(job)
    return future


def ran_first(group_name: str) -> None:
    """A group's first run ended: after the graph's last one, its deferred
    compiles run."""
    with _lock:
        graph = _graphs.get(graph_of(group_name))
        if graph is None:
            return
        graph.first_runs += 1
        done = graph.first_runs >= graph.groups
    if done:
        flush(group_name)
        with _lock:  # every group of it past its first run: nothing more to defer (a loop of new graphs keeps none)
            _graphs.pop(graph_of(group_name), None)


def flush(group_name: str) -> None:
    """Compiles what the group's graph deferred (nothing when already done).
    A graph whose first execution ended early (a group raised) flushes at
    the end of its next: its groups' first runs come then."""
    with _lock:
        graph = _graphs.get(graph_of(group_name))
        jobs, graph.jobs = (graph.jobs, []) if graph is not None else ([], [])
    if jobs:
        with background.compile_lock:  # Inductor's config patches are process-global
            _compile_all(graph_of(group_name), jobs)


def _compile_all(graph_name: str, jobs: list) -> None:
    cfg = jobs[0].cfg
    start = time.perf_counter()
    leaders = sorted((job for job in jobs if job.leader is None), key=lambda j: -j.num_ops)
    todo = [job for job in leaders if job.prepared is not None]
    try:
        workers = []
        if len(todo) >= 2 and sum(j.num_ops for j in todo[1:]) >= MIN_OPS_FOR_WORKERS:
            workers = [WorkerProcess() for _ in range(min(cfg.compile_workers, len(todo) - 1))]
        if cfg.progress and len(todo) > 1:
            print(f"lazy_mlir: compiling {len(todo)} groups of {graph_name} "
                  f"({sum(j.num_ops for j in todo)} ops) in {1 + len(workers)} processes ...",
                  file=sys.stderr, flush=True)
            layer_groups.print_compile_hint()
        with progress.still_compiling(f"the groups of {graph_name}", cfg.progress):
            _generate(todo, workers)
        for job in leaders + [job for job in jobs if job.leader is not None]:  # followers read the cache
            job.finish()
    finally:
        for job in jobs:  # never leave a group waiting: an unfinished one falls back
            if not job.future.done():
                job.future.set_result(None)
    if cfg.progress and len(todo) > 1:
        print(f"lazy_mlir: compiled {len(todo)} groups of {graph_name} in {time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)


def _generate(jobs: list, workers: list[WorkerProcess]) -> None:
    """Each prepared job's code: this thread takes the largest left, each
    worker (once started) the next; a job a worker failed comes back here."""
    pending = collections.deque(jobs)
    cond = threading.Condition()
    busy = [0]

    def serve(worker: WorkerProcess) -> None:
        if not worker.wait_ready():
            return
        while worker.alive:
            with cond:
                job = next((j for j in pending if j.portable and j.worker_failure is None), None)
                if job is None:
                    return
                pending.remove(job)
                busy[0] += 1
            reply = worker.compile(*job.request())
            with cond:
                busy[0] -= 1
                if reply[0] == "done":
                    job.generated_elsewhere(reply[1], reply[2], reply[3])
                else:
                    job.worker_failure = reply[1]
                    pending.appendleft(job)  # this process generates it, no worker tries it again
                cond.notify_all()

    threads = [threading.Thread(target=serve, args=(w,), name="lazy_mlir compile worker", daemon=True)
               for w in workers]
    for t in threads:
        t.start()
    try:
        while True:
            with cond:
                while not pending and busy[0]:
                    cond.wait()
                if not pending:
                    break
                job = pending.popleft()
            job.generate()
    finally:
        for worker in workers:
            worker.stop()  # idle, or still starting: not needed any more
        for t in threads:
            t.join()
        for worker in workers:
            worker.close()
