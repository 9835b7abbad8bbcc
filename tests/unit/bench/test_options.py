"""QuickSizes: a bench's quick options are its QUICK sizes, then the overrides that are not None."""

from dataclasses import fields

from worker.bench.bench import BenchOptions
from worker.bench.model_swaps import SwapBenchOptions
from worker.bench.shadow_cost import ShadowBenchOptions


def test_quick_takes_the_quick_sizes_then_the_overrides_not_none() -> None:
    options = ShadowBenchOptions.quick(messages=50, pairs=None, partitions=2)

    assert (options.messages, options.pairs, options.partitions, options.settle_s) == (50, 1, 2, 20.0)


def test_quick_is_not_a_field_and_each_bench_keeps_its_own() -> None:
    assert "QUICK" not in {f.name for f in fields(BenchOptions)}
    assert SwapBenchOptions.quick().chunk == 100
    assert BenchOptions.quick().messages == 600
    assert BenchOptions().messages != 600
