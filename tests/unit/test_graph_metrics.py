"""Timed passes that ran eager in graph mode: graph_metrics' sums over sides, the run's warning, the report's graphs
cell and bench.spec's per-row totals (the runner's counting: tests/engine/test_graph_variants.py)."""

import logging

from attnlab.bench.spec import Row, _add_graph_passes
from attnlab.measure import eager_keys, graph_metrics, warn_eager
from attnlab.report import _graphs_cell


def test_metrics_sum_the_sides_and_sort_the_keys_most_first():
    before = {"target": (10, {(8, 5, 0, None): 1}), "draft": (4, {})}
    after = {"target": (30, {(8, 5, 0, None): 4, (">8", 5, 0, None): 2}), "draft": (9, {(8, 1, 2, "split"): 7})}
    assert graph_metrics(before, after) == {
        "graph_passes_replayed": 25, "graph_passes_eager": 12,
        "graph_eager_keys": ["draft b8 q1 slot 2 variant split x7", "target b8 q5 slot 0 x3", "target b>8 q5 slot 0 x2"]}


def test_a_run_with_eager_passes_warns_once_and_names_its_keys(caplog):
    keys = [f"target b{b} q5 slot 0 x1" for b in range(6)]
    with caplog.at_level(logging.WARNING, logger="attnlab"):
        warn_eager({"graph_passes_replayed": 94, "graph_passes_eager": 6, "graph_eager_keys": keys})
        warn_eager({"graph_passes_replayed": 94, "graph_passes_eager": 0, "graph_eager_keys": []})
        warn_eager({})
    assert len(caplog.records) == 1
    text = caplog.records[0].getMessage()
    assert text.startswith("6 of 100 graph-eligible timed passes ran eager") and "target b3 q5" in text
    assert "target b4" not in text and text.endswith("2 more keys")


def test_the_reports_graphs_cell_says_how_many_passes_ran_eager():
    on = {"engine": {"cuda_graph": True}}
    assert _graphs_cell({"cuda_graphs": 4, "graph_passes_replayed": 90, "graph_passes_eager": 10}, on) == (
        "yes, 10 of 100 eager")
    assert _graphs_cell({"cuda_graphs": 4, "graph_passes_replayed": 90, "graph_passes_eager": 0}, on) == "yes"
    assert _graphs_cell({"cuda_graphs": 4}, {}) == "yes"  # a run from before the counters
    assert _graphs_cell({}, {"engine": {"cuda_graph": False}}) == "no"


def test_bench_spec_rows_add_their_batches_counts():
    row = Row(engine="attnlab", drafter="ngram", pair="-/triton", seconds=0.0, new_tokens=0, target_passes=0)
    _add_graph_passes(row, 5, {"target b8 q5 slot 0": 2})
    _add_graph_passes(row, 5, {"target b8 q5 slot 0": 1, "target b4 q1 slot 0": 3})
    _add_graph_passes(row, 0, {})
    assert row.graph_replays == 10 and row.graph_eager == {"target b8 q5 slot 0": 3, "target b4 q1 slot 0": 3}
    assert eager_keys(row.graph_eager) == ["target b4 q1 slot 0 x3", "target b8 q5 slot 0 x3"]
