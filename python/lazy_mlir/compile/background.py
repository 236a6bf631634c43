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

# Both pool modules register their exit hooks before ours (see submit):
# Inductor imports the process pool's only while compiling, too late to
# register during ours ("can't register atexit after shutdown": a compile
# at exit failed).
import concurrent.futures.process  # noqa: F401
import concurrent.futures.thread  # noqa: F401
import contextlib
import sys
import threading
from concurrent.futures import Future
from typing import Callable

compile_lock = threading.Lock()
_worker = threading.local()  # .compiling: True on a worker thread while its compile runs
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
            _worker.compiling = True
            try:
                result = compile_fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the step that waits for it
                error = exc
            finally:
                _worker.compiling = False
        with _state:  # no longer pending before it is done: a group that sees it done compiles anew
            if _pending.get(key) is future:
                del _pending[key]
            if not _pending:
                sys.setswitchinterval(_switch_interval[0])
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    _leave_rng_alone_on_workers()
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


def _leave_rng_alone_on_workers() -> None:
    """AOTAutograd and Inductor wrap a compile in Dynamo's
    ``preserve_rng_state``: they read the process's RNG states (CPU, CUDA)
    at its start and set them back at its end. On a worker thread that
    rewinds the training thread's generators: every draw it made during the
    compile (dropout masks drawn in the glue graph, a sampler's shuffle)
    comes again after it (549 of 631 draws in a repro; most likely why the
    zoo's mT5 with dropout once trained 0.98 off eager). On these threads it
    reads and sets nothing: the compile of a group draws no random number
    (random ops stay in TorchScript; 640 of 640 draws kept across a cold
    compile), and test_background_compile checks the draws. Installed in
    every torch module that imported it by name, before the first worker."""
    import torch._dynamo.utils as dynamo_utils

    original = dynamo_utils.preserve_rng_state
    if getattr(original, "lazy_mlir_leaves_workers_alone", False):
        return

    @contextlib.contextmanager
    def preserve_rng_state():
        if getattr(_worker, "compiling", False):
            yield
        else:
            with original():
                yield

    preserve_rng_state.lazy_mlir_leaves_workers_alone = True
    for name, module in list(sys.modules.items()):
        if name.startswith("torch") and module is not None and vars(module).get("preserve_rng_state") is original:
            module.preserve_rng_state = preserve_rng_state


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
