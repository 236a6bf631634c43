"""Compiles on a worker thread while training goes on (``Config.background_compile``).

A group seen at a new size whose shape-generic form must be compiled would
stall its step for a whole compile (tens of seconds). Instead the compile
runs here, and the group runs its TorchScript subgraph until the code is
ready (``executables.GroupExecutable``): the step at a new sequence length
or a ragged last batch costs one interpreted run, not a compile.

Compiles run one at a time, under ``compile_lock``, which every compile in
the process takes (Inductor's config patches are process-global). The
interpreted run releases the GIL inside TorchScript, so on 2 cores the
compile and the steps share the machine. A process that ends while a
compile runs waits for it at exit, saying so (its code then is in the
cache folder for the next process): a thread stopped inside torch's C++
code at interpreter exit aborts the process.
"""
from __future__ import annotations

import concurrent.futures.thread  # noqa: F401 - registers its exit hook before ours (see submit)
import sys
import threading
from concurrent.futures import Future
from typing import Callable

compile_lock = threading.Lock()
_pending: dict[str, Future] = {}  # key (a group family) -> its compile, until done
_state = threading.Lock()  # guards _pending and _workers
_workers: list[threading.Thread] = []
# While a compile runs, the GIL changes hands every SWITCH_INTERVAL seconds
# instead of CPython's 5 ms. The tracing thread drops the GIL inside every
# torch op it calls; the compile, busy in Python, takes it and would keep it
# for a whole interval each time: a step of ~1,000 ops then took seconds.
# (One-off check, HF GPT-2: a step in TorchScript took 6.5 ms alone, and
# beside its generic compile ~110 ms at 100 us, ~60 ms at 20 us, the
# compile then 8% slower.)
SWITCH_INTERVAL = 0.00002
_switch_interval = [sys.getswitchinterval()]  # CPython's, restored when no compile runs


def submit(key: str, compile_fn: Callable[[], object]) -> Future:
    """Runs ``compile_fn`` on a worker thread (after any compile before it);
    its result or exception ends up in the returned future."""
    future: Future = Future()

    def work():
        result = error = None
        with compile_lock:
            try:
                result = compile_fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the step that waits for it
                error = exc
        with _state:  # no longer pending before it is done: a group that sees it done compiles anew
            if _pending.get(key) is future:
                del _pending[key]
            if not _pending:
                sys.setswitchinterval(_switch_interval[0])
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    worker = threading.Thread(target=work, name=f"lazy_mlir compile {key[:12]}", daemon=True)
    with _state:
        if not _pending:
            _switch_interval[0] = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_INTERVAL)
        _pending[key] = future
        if not _workers:
            # Thread-exit hooks run in reverse order, before atexit's: ours,
            # registered after concurrent.futures', runs while the pools
            # Inductor compiles with still take work ("cannot schedule new
            # futures after interpreter shutdown" otherwise).
            threading._register_atexit(_join_at_exit)
        _workers.append(worker)
    worker.start()
    return future


def pending(key: str) -> Future | None:
    """The compile running or queued for ``key``, if any."""
    with _state:
        return _pending.get(key)


def wait(timeout: float | None = None) -> bool:
    """Waits for every compile started so far; False if ``timeout`` seconds
    passed first. The groups switch to the new code at their next run."""
    with _state:
        futures = list(_pending.values())
    for future in futures:
        try:
            future.exception(timeout=timeout)
        except TimeoutError:
            return False
    return True


def _join_at_exit() -> None:
    with _state:
        running = [w for w in _workers if w.is_alive()]
    if running:
        print(f"lazy_mlir: waiting for {len(running)} background compile(s) to finish before exit",
              file=sys.stderr, flush=True)
    for worker in running:
        worker.join()
