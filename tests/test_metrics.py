"""metrics.snapshot() and report() describe the steps since reset()."""
from lazy_mlir.observe import metrics
from helpers import LAZY, make_mlp, mlp_batches, sgd, train


def test_snapshot_and_report(lazy_level):
    train(make_mlp, sgd, mlp_batches(3, batch=9), LAZY)
    s = metrics.snapshot()
    assert s["mark_steps"] == 3 and s["graph_executions"] == 3
    assert s["executions_per_mark_step"] == 1.0
    assert s["traces"] == 3 and s["cache_hits"] + s["cache_misses"] == 3
    assert s["groups_built"] >= 1 and sum(s["groups_per_graph"].values()) == s["groups_built"]
    assert s["seconds"]["execute"] > 0
    text = metrics.report()
    assert "graph executions     3  (1.00 per mark_step)" in text
    metrics.reset()
    assert metrics.snapshot()["mark_steps"] == 0 and metrics.snapshot()["graph_executions"] == 0


def test_per_group_records_keep_the_most_recent(lazy_level):
    """A loop that meets new graphs for ever (new shapes, new code) holds
    KEPT group and recompile records, not one per graph it ever ran."""
    for i in range(metrics.KEPT + 10):
        metrics.record_group(f"graph{i}.g0", 3)
        metrics.record_recompile({"group": f"graph{i}.g0"})
    s = metrics.snapshot()
    assert sum(s["groups_per_graph"].values()) == metrics.KEPT and "graph9" not in s["groups_per_graph"]
    assert len(s["recompiles"]) == metrics.KEPT and s["recompiles"][-1]["group"] == f"graph{metrics.KEPT + 9}.g0"
    metrics.reset()
