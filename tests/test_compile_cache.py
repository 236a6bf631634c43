"""The compile cache: structural keys (no source lines), the persistent
folder across processes, damaged and concurrently written entries, its size
bound and its switch."""
import json
import multiprocessing
import os
import subprocess
import sys
import warnings

import pytest
import torch

import lazy_mlir
from lazy_mlir import config
from lazy_mlir.cache import compile_cache, group_key
from lazy_mlir.cache.disk_cache import CorruptEntry, DiskCache, LIBRARY_SUFFIX, LOCK_SUFFIX, SUFFIX, decode, encode
from lazy_mlir.cluster import compilable
from lazy_mlir.observe import metrics
from lazy_mlir.run import group_compiler
from helpers import LAZY


def _hand_groups_over_again(**options):
    """LTC keeps the graphs it compiled: a new classification generation makes
    it hand each group to lazy_mlir again, and with the in-memory variants
    forgotten the lookups go to the folder on disk."""
    compile_cache.clear_memory()
    marker = "aten::lazy_mlir_test_never_traced"
    compilable.deny(marker)  # bumps the generation
    compilable.DENIED.discard(marker)
    lazy_mlir.init("O1", **options)


@pytest.mark.python_wrapper
def test_same_computation_from_another_source_line_hits(lazy_level, lowerings, monkeypatch):
    graphs = []
    monkeypatch.setattr(group_compiler, "before_build", lambda graph, name: graphs.append(graph.copy()))
    x = torch.randn(5, 19)
    first = (x.to(LAZY) * 3 - 1).tanh().sum(0)
    torch._lazy.mark_step()
    second = (x.to(LAZY) * 3 - 1).tanh().sum(0)
    noise = torch.rand(3, device=LAZY)  # random: stays in TorchScript, makes LTC see a new graph
    torch._lazy.mark_step()
    assert len(graphs) == 2 and str(graphs[0]) != str(graphs[1])  # the source lines differ
    assert group_key.structure(graphs[0]) == group_key.structure(graphs[1])
    s = metrics.snapshot()
    assert len(lowerings) == 1 and s["group_cache_hits"] == 1 and s["group_cache_misses"] == 1, metrics.report()
    torch.testing.assert_close(second.cpu(), (x * 3 - 1).tanh().sum(0))
    assert first.cpu().equal(second.cpu()) and noise.cpu().shape == (3,)


def test_structure_sees_constants_wiring_and_types(lazy_level, monkeypatch):
    graphs = []
    monkeypatch.setattr(group_compiler, "before_build", lambda graph, name: graphs.append(graph.copy()))
    x, y = torch.randn(4, 23).to(LAZY), torch.randn(4, 23).to(LAZY)
    torch._lazy.mark_step()
    for fn in (lambda: (x - y * 2).sum(0), lambda: (x * 2 - y).sum(0), lambda: (x - y * 2).sum(1),
               lambda: (x - y * 2).amax(0)):
        out = fn()  # wiring, a constant, an op kind: each differs from the first
        torch._lazy.mark_step()
        out.cpu()
    digests = [group_key.structure(g) for g in graphs]
    assert len(set(digests)) == len(digests) == 4, [str(g) for g in graphs]


def test_input_signature_sees_layout_dtype_and_aliasing():
    a = torch.randn(6, 6)
    base = group_key.input_signature([a, torch.randn(6, 6)])
    assert group_key.input_signature([torch.randn(6, 6), torch.randn(6, 6)]) == base
    for other in ([a.t(), a], [a.double(), a], [a, a]):
        assert group_key.input_signature(other) != base


CHILD = """
import json, torch, lazy_mlir
from lazy_mlir import metrics
lazy_mlir.init("O1", progress=False)
x = torch.linspace(-2, 2, 7 * 29).reshape(7, 29)
y = ((x.to("lazy") * 1.5 + 0.25).sigmoid() * x.to("lazy")).sum(1)
torch._lazy.mark_step()
s = metrics.snapshot()
print(json.dumps({"y": y.cpu().tolist(), "misses": s["group_cache_misses"], "disk_hits": s["group_cache_disk_hits"],
                  "stage_runs": s["stage_runs"], "fallen_back": s["groups_fallen_back"]}))
"""


def _child(cache_dir, **env):
    return subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "LAZY_MLIR_CACHE_DIR": str(cache_dir), **env})


def _result(proc) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.python_wrapper
def test_a_second_process_skips_our_stages(tmp_path):
    """Two processes need the same group at once in one folder (as ranks or
    test workers do): one compiles it, the other waits for its entry (or
    finds it there); a third loads it. Only one runs the lowering stages."""
    x = torch.linspace(-2, 2, 7 * 29).reshape(7, 29)
    expected = ((x * 1.5 + 0.25).sigmoid() * x).sum(1)
    cold = [_result(p) for p in [_child(tmp_path), _child(tmp_path)]]
    warm = _result(_child(tmp_path))
    for r in cold + [warm]:
        torch.testing.assert_close(torch.tensor(r["y"]), expected)
        assert r["fallen_back"] == {}
    lowered = [r for r in cold if r["stage_runs"].get("ts_to_fx", 0) >= 1]
    assert len(lowered) == 1 and lowered[0]["misses"] >= 1, cold
    other = cold[1 - cold.index(lowered[0])]
    assert other["disk_hits"] >= 1 and not {"ts_to_fx", "fx_to_mlir"} & set(other["stage_runs"]), cold
    assert warm["misses"] == 0 and warm["disk_hits"] >= 1, warm
    assert not {"ts_to_fx", "fx_to_mlir", "mlir_passes", "mlir_to_fx"} & set(warm["stage_runs"]), warm
    entries = [n for n in os.listdir(tmp_path) if not n.endswith(LOCK_SUFFIX)]
    assert entries and all(n.endswith(SUFFIX) for n in entries), entries  # no temporary file left behind
    for n in entries:
        decode((tmp_path / n).read_bytes())


def _damage(path, how: str, other_entry: bytes) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flipped":
        path.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    elif how == "not a pickle":
        path.write_bytes(encode(b"certainly not a pickle"))
    else:  # a valid entry of another key, under this key's name
        path.write_bytes(other_entry)


@pytest.mark.parametrize("how,message", [("truncated", "truncated"), ("flipped", "checksum mismatch"),
                                         ("not a pickle", "UnpicklingError"),
                                         ("another key's", "entry written for another key")])
@pytest.mark.python_wrapper
def test_damaged_entry_is_rebuilt_with_a_warning(lazy_level, lowerings, tmp_path, how, message):
    options = {"cache_dir": str(tmp_path), "progress": False}
    _hand_groups_over_again(**options)  # an earlier parameter's graph: compiled into this folder anew

    def step(x):
        y = (x.to(LAZY).exp() - x.to(LAZY)).mean(0)
        torch._lazy.mark_step()
        return y.cpu()

    x = torch.randn(3, 31)
    step(x)
    entries = sorted(tmp_path.iterdir(), key=lambda p: p.stat().st_size)
    assert len(lowerings) == 1 and entries
    target = entries[-1]
    other = DiskCache(str(tmp_path), 1 << 30)
    other.write("0" * 64, pickle_entry_for_another_key())
    _damage(target, how, (tmp_path / ("0" * 64 + SUFFIX)).read_bytes())
    _hand_groups_over_again(**options)
    with pytest.warns(RuntimeWarning, match=f"cache entry .* is unusable .*{message}"):
        y = step(x)
    torch.testing.assert_close(y, (x.exp() - x).mean(0))
    assert len(lowerings) == 2  # rebuilt
    decode(target.read_bytes())  # and written again, whole
    _hand_groups_over_again(**options)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="lazy_mlir")
        torch.testing.assert_close(step(x), y)
    assert len(lowerings) == 2 and metrics.snapshot()["group_cache_disk_hits"] >= 1


def pickle_entry_for_another_key() -> bytes:
    import pickle
    return pickle.dumps({"key": "0" * 64, "guarded_inputs": []})


def test_switched_off_writes_nothing(lazy_level, tmp_path, monkeypatch):
    monkeypatch.setenv("LAZY_MLIR_CACHE", "0")
    assert config.Config().cache is False
    monkeypatch.setenv("LAZY_MLIR_CACHE", "1")
    lazy_mlir.init("O1", cache=False, cache_dir=str(tmp_path / "cache"))
    x = torch.randn(2, 37)
    y = (x.to(LAZY) * 2).cos()
    torch._lazy.mark_step()
    torch.testing.assert_close(y.cpu(), (x * 2).cos())
    assert not (tmp_path / "cache").exists()
    assert metrics.snapshot()["group_cache_misses"] == 1


def test_folder_location_and_limit_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("LAZY_MLIR_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert config.Config().cache_dir == str(tmp_path / "xdg" / "lazy_mlir")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config.Config().cache_dir == str(tmp_path / "home" / ".cache" / "lazy_mlir")
    monkeypatch.setenv("LAZY_MLIR_CACHE_DIR", str(tmp_path / "moved"))
    monkeypatch.setenv("LAZY_MLIR_CACHE_MAX_MB", "5")
    cfg = config.Config()
    assert cfg.cache_dir == str(tmp_path / "moved") and cfg.cache_max_mb == 5
    with pytest.raises(ValueError, match="cache_max_mb"):
        config.Config(cache_max_mb=0).validate()


def test_folder_size_is_bounded_least_recently_used_first(tmp_path):
    cache = DiskCache(str(tmp_path), max_bytes=3 * 1100)
    for i in range(3):
        assert cache.write(f"k{i}", bytes([i]) * 1000)
        os.utime(cache.path(f"k{i}"), (1000 + i, 1000 + i))
    assert cache.read("k0") == bytes([0]) * 1000  # a hit makes it the most recently used
    cache.write("k3", b"\3" * 1000)
    assert cache.read("k1") is None  # the least recently used went first
    assert all(cache.read(k) is not None for k in ("k0", "k2", "k3"))
    assert cache.size() <= cache.max_bytes


def test_libraries_are_written_once_and_bounded_with_the_entries(tmp_path):
    """compile_cache writes a native library out of its entry to load it:
    once per content, and trimmed with the entries, least recently used first."""
    cache = DiskCache(str(tmp_path), max_bytes=3 * 1100)
    path = cache.library("a" * 64, b"\1" * 1000)
    assert path == str(tmp_path / ("a" * 64 + LIBRARY_SUFFIX)) and open(path, "rb").read() == b"\1" * 1000
    os.utime(path, (1000, 1000))
    assert cache.library("a" * 64, b"\1" * 1000) == path and os.path.getmtime(path) > 1000  # reused, touched
    os.utime(path, (1000, 1000))
    for i in range(3):
        cache.write(f"k{i}", bytes([i]) * 1000)
    assert not os.path.exists(path) and cache.size() <= cache.max_bytes


def test_stale_temporary_files_are_removed(tmp_path):
    cache = DiskCache(str(tmp_path), max_bytes=1 << 20)
    stale, fresh = tmp_path / ".dead.tmp", tmp_path / ".writing.tmp"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    os.utime(stale, (1, 1))
    cache.write("k", b"payload")
    assert not stale.exists() and fresh.exists()


def test_decode_rejects_what_it_did_not_write():
    good = encode(b"payload")
    assert decode(good) == b"payload"
    for bad in (good[:10], good[:-1], b"X" + good[1:], good[:-1] + b"Q"):
        with pytest.raises(CorruptEntry):
            decode(bad)


def _writer(directory, worker, rounds):
    cache = DiskCache(directory, 1 << 30)
    for _ in range(rounds):
        cache.write("shared", bytes([worker]) * (300_000 + worker))


def _reader(directory, rounds, queue):
    cache = DiskCache(directory, 1 << 30)
    seen, problems = set(), []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(rounds):
            payload = cache.read("shared")
            if payload is None:
                continue
            worker = payload[0]
            if len(payload) != 300_000 + worker or payload.count(worker) != len(payload):
                problems.append(f"mixed payload of {len(payload)} bytes")
            seen.add(worker)
    queue.put((sorted(seen), problems + [str(w.message) for w in caught]))


def test_concurrent_writers_never_expose_a_partial_entry(tmp_path):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    writers = [ctx.Process(target=_writer, args=(str(tmp_path), w, 40)) for w in range(1, 4)]
    readers = [ctx.Process(target=_reader, args=(str(tmp_path), 300, queue)) for _ in range(2)]
    for p in writers + readers:
        p.start()
    results = [queue.get(timeout=300) for _ in readers]
    for p in writers + readers:
        p.join(timeout=300)
        assert p.exitcode == 0
    for seen, problems in results:
        assert problems == []
    assert DiskCache(str(tmp_path), 1 << 30).read("shared")[0] in (1, 2, 3)
    assert [n for n in os.listdir(tmp_path)] == ["shared" + SUFFIX]


def _hold_lock(directory, held, release, die):
    with DiskCache(directory, 1 << 30).lock("group"):
        held.set()
        release.wait(60)
        if die:
            os._exit(3)  # a rank that crashes mid-compile: the kernel drops its lock


@pytest.mark.parametrize("die", [False, True], ids=["released", "holder_died"])
def test_a_compile_lock_held_elsewhere_is_waited_for(tmp_path, die):
    """DiskCache.lock: the second process says it waits and gets the lock
    once the first releases it or dies (no stale lock)."""
    ctx = multiprocessing.get_context("fork")
    held, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(tmp_path), held, release, die))
    holder.start()
    assert held.wait(60)
    waits = []

    def on_wait():
        waits.append(1)
        release.set()

    with DiskCache(str(tmp_path), 1 << 30).lock("group", on_wait):
        assert waits == [1]
        holder.join(60)  # the lock is ours: the holder has let go of it
        assert holder.exitcode == (3 if die else 0)
    with DiskCache(str(tmp_path), 1 << 30).lock("group", on_wait):  # free now: no wait
        assert waits == [1]


def _step_checked_against_eager(x: torch.Tensor):
    """A one-group step of its own on ``x`` (a width no other test uses):
    runs it lazily and checks the result against eager."""
    def run():
        out = (x.to(LAZY) * 5).cos().sum(0)
        torch._lazy.mark_step()
        torch.testing.assert_close(out.cpu(), (x * 5).cos().sum(0))
    return run


@pytest.mark.python_wrapper
def test_a_group_that_failed_is_not_tried_again_in_the_next_process(lazy_level, monkeypatch):
    from lazy_mlir.compile import routes

    def broken(graph, inputs, name, cfg):
        raise RuntimeError("injected lowering failure")

    run = _step_checked_against_eager(torch.randn(3, 29))
    monkeypatch.setattr(routes, "lower_group", broken)
    with pytest.warns(RuntimeWarning, match=r"failed to compile \(RuntimeError: injected lowering failure\)"):
        run()
    attempts = []
    monkeypatch.setattr(routes, "lower_group", lambda *args: attempts.append(args))
    _hand_groups_over_again()  # as a new process would: nothing in memory, the folder on disk
    metrics.reset()
    with pytest.warns(RuntimeWarning, match=r"it failed before, in this environment \(RuntimeError: injected"):
        run()
    assert attempts == []  # not lowered again
    assert any("failed before" in why for why in metrics.snapshot()["groups_fallen_back"].values())


@pytest.mark.python_wrapper
def test_a_warning_raised_as_an_error_is_not_remembered_on_disk(lazy_level, monkeypatch):
    """A compile that failed on a warning the user's filter raised (-W error
    in a compile thread; the step's own compile defers such warnings, see
    test_syncs) says nothing about the group: it is not remembered on disk,
    and the next process compiles the group again."""
    from lazy_mlir.compile import routes

    def warns(graph, inputs, name, cfg):
        raise DeprecationWarning("injected deprecation")  # what warnings.warn raises under an error filter

    run = _step_checked_against_eager(torch.randn(3, 31))
    monkeypatch.setattr(routes, "lower_group", warns)
    with pytest.warns(RuntimeWarning, match=r"failed to compile \(DeprecationWarning: injected deprecation"):
        run()  # in TorchScript
    attempts = []
    monkeypatch.setattr(routes, "lower_group", lambda *args: attempts.append(args))
    _hand_groups_over_again()  # as a new process would: nothing in memory, the folder on disk
    run()
    assert len(attempts) == 1  # lowered again


def test_layout_guesses_keep_the_latest(monkeypatch):
    """Deferred compiles' layout guesses (executables._layout_guesses) are
    bounded by memory_cache_entries: the oldest go first, and one stored
    again counts as new."""
    import dataclasses

    from lazy_mlir.run import executables
    monkeypatch.setattr(executables, "_layout_guesses", {})
    monkeypatch.setattr(config, "current", dataclasses.replace(config.current, memory_cache_entries=3))
    for i in range(5):
        executables._remember_layout_guess((str(i), "cfg"), (i,))
        if i == 2:
            executables._remember_layout_guess(("0", "cfg"), ("again",))
    assert list(executables._layout_guesses) == [("0", "cfg"), ("3", "cfg"), ("4", "cfg")]
    assert executables._layout_guesses[("0", "cfg")] == ("again",)


def test_groups_in_memory_keep_the_latest_used(monkeypatch):
    """The in-memory variants are bounded by memory_cache_entries: a lookup
    makes a group the newest, a store past the bound drops the oldest."""
    import dataclasses

    from lazy_mlir.lowering.lowered_group import LoweredGroup
    cfg = dataclasses.replace(config.current, memory_cache_entries=2, cache=False)
    monkeypatch.setattr(config, "current", cfg)
    monkeypatch.setattr(compile_cache, "_entries", compile_cache._Recent())
    groups = {k: LoweredGroup(lambda inputs: inputs, []) for k in ("a", "b", "c")}
    compile_cache.store("a", groups["a"], cfg)
    compile_cache.store("b", groups["b"], cfg)
    assert compile_cache.lookup("a", [], "g", cfg) is groups["a"]  # now newer than b
    compile_cache.store("c", groups["c"], cfg)
    assert compile_cache.memory_entries() == 2
    assert compile_cache.lookup("b", [], "g", cfg) is None
    assert compile_cache.lookup("a", [], "g", cfg) is groups["a"]
    assert compile_cache.lookup("c", [], "g", cfg) is groups["c"]
