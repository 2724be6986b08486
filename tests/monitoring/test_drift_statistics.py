"""The drift statistics on generated data, against scipy and the hand formulas."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from dbspec.monitoring.drift import (LATENCY_EDGES, ColumnAccumulator, Thresholds,
                                     WindowAccumulator, chi_square_p, compare_column,
                                     ks_binned, latency_quantile, psi, quality_drop)
from dbspec.monitoring.profile import build_profile, check_profile, profile_column


def _accumulate(profile, values, batch=997):
    accumulator = ColumnAccumulator(profile)
    for start in range(0, len(values), batch):  # batch by batch, as a scan feeds it
        accumulator.update(values[start:start + batch])
    return accumulator


def test_psi_is_the_hand_formula():
    reference, window = np.array([50, 30, 20]), np.array([20, 30, 50])
    p, q = reference / 100, window / 100
    assert psi(reference, window) == pytest.approx(float(np.sum((q - p) * np.log(q / p))))
    assert psi(reference, reference * 7) == pytest.approx(0.0)


def test_psi_of_an_empty_bin_is_finite():
    assert np.isfinite(psi(np.array([10, 0]), np.array([5, 5])))


def test_chi_square_matches_scipy_on_the_counts():
    reference, window = np.array([40, 35, 25]), np.array([30, 30, 40])
    expected = stats.chi2_contingency(np.vstack([reference, window]), correction=False).pvalue
    assert chi_square_p(reference, window) == pytest.approx(expected)
    assert chi_square_p(np.array([5, 0]), np.array([7, 0])) == 1.0  # one bin with rows


@pytest.mark.parametrize("shift", [0.0, 0.3, 3.0])
def test_binned_ks_is_close_to_scipy_ks_2samp(shift):
    rng = np.random.default_rng(7)
    train, served = rng.normal(size=5000), rng.normal(loc=shift, size=3000)
    profile = profile_column(train)
    accumulator = _accumulate(profile, served)
    statistic, p_value = ks_binned(np.asarray(profile["fine_counts"]), accumulator.fine_counts)
    exact = stats.ks_2samp(train, served, method="asymp")
    # the binned statistic is a lower bound that misses by at most one fine bin (1% of rows)
    assert exact.statistic - 0.02 <= statistic <= exact.statistic + 1e-12
    if shift == 0.0:
        assert p_value > 0.01
    else:
        assert p_value < 1e-6
        # the same statistic gives scipy's asymptotic p-value
        same = stats.kstwo.sf(statistic, round(5000 * 3000 / 8000))
        assert p_value == pytest.approx(same)


def test_profile_bins_hold_every_row_and_split_them_evenly():
    values = np.random.default_rng(1).normal(size=10_000)
    profile = profile_column(values)
    assert profile["kind"] == "numeric"
    assert sum(profile["counts"]) == sum(profile["fine_counts"]) == 10_000
    assert len(profile["counts"]) == 10 and len(profile["fine_counts"]) == 100
    assert max(profile["counts"]) - min(profile["counts"]) <= 2
    assert profile["min"] == values.min() and profile["max"] == values.max()
    # the accumulator's bins are the profile's: the training rows reproduce its counts
    accumulator = _accumulate(profile, values)
    assert accumulator.counts.tolist() == profile["counts"]
    assert accumulator.fine_counts.tolist() == profile["fine_counts"]


def test_a_column_with_few_values_is_profiled_as_categories():
    values = np.array([0.05, -0.04, 0.05, 0.05, np.nan])
    profile = profile_column(values)
    assert profile == {"kind": "discrete", "count": 4, "missing": 1, "values": [-0.04, 0.05],
                       "counts": [1, 3]}


def test_unshifted_data_does_not_drift_over_many_windows():
    """No false alarm at the default thresholds: 10 features, 40 windows of the same
    distribution (small and large), discrete columns included."""
    rng = np.random.default_rng(11)
    train = {f"x{j}": rng.normal(size=300) for j in range(9)}
    train["sex"] = rng.choice([0.05, -0.04], size=300)
    profile = build_profile(train, {"prediction": rng.normal(size=300)}, task="regression")
    names = list(profile["columns"])
    for window in range(40):
        rows = [100, 500, 5000][window % 3]
        accumulator = WindowAccumulator(profile, names, start=0.0)
        served = {name: rng.normal(size=rows) for name in names}
        served["sex"] = rng.choice([0.05, -0.04], size=rows)
        accumulator.update(served, np.full(rows, 2.0))
        for name in names:
            result = compare_column(name, accumulator.columns[name], Thresholds())
            assert not result.findings, (window, rows, result)


def test_a_shifted_feature_drifts_and_the_others_do_not():
    rng = np.random.default_rng(3)
    profile = build_profile({"a": rng.normal(size=400), "b": rng.normal(size=400)},
                            {"prediction": rng.normal(size=400)}, task="regression")
    accumulator = WindowAccumulator(profile, ["a", "b"], start=0.0)
    accumulator.update({"a": rng.normal(loc=4.0, size=300), "b": rng.normal(size=300)},
                       np.ones(300))
    a = compare_column("a", accumulator.columns["a"], Thresholds())
    b = compare_column("b", accumulator.columns["b"], Thresholds())
    assert a.drifted and not b.drifted
    assert a.ks > 0.9 and a.psi > 2 and a.out_of_range_rate > 0.5
    assert any(r.startswith("PSI") for r in a.reasons)
    assert json.loads(json.dumps(a.to_json()))["drifted"] is True


def test_missing_values_and_unseen_categories_are_counted():
    profile = build_profile({"x": np.arange(100.0), "c": np.tile([1.0, 2.0], 50)},
                            {"prediction": np.arange(100.0)}, task="regression")
    accumulator = WindowAccumulator(profile, ["x", "c"], start=0.0)
    values = np.arange(200.0)
    values[:20] = np.nan
    accumulator.update({"x": values, "c": np.tile([1.0, 3.0], 100)}, np.ones(200))
    x = compare_column("x", accumulator.columns["x"], Thresholds())
    c = compare_column("c", accumulator.columns["c"], Thresholds())
    assert x.missing_rate == pytest.approx(0.1)
    assert x.out_of_range_rate == pytest.approx(100 / 180)  # 100..199 above the training max
    assert "10.0% missing" in x.reasons
    assert c.out_of_range_rate == pytest.approx(0.5)  # 3.0 was never seen
    assert ("out_of_range", "50.0% unseen") in c.findings


def test_class_predictions_are_categories_by_label():
    profile = build_profile({"x": np.arange(50.0)},
                            {"prediction": np.array(["no", "yes"] * 25, dtype=object),
                             "probability": np.linspace(0, 1, 50)},
                            task="binary", classes=["no", "yes"])
    column = profile["columns"]["prediction"]
    assert column["kind"] == "discrete" and column["values"] == ["no", "yes"]
    accumulator = _accumulate(column, np.array(["yes"] * 40 + ["no"] * 10, dtype=object))
    assert accumulator.counts.tolist() == [10, 40, 0]
    assert check_profile(json.loads(json.dumps(profile)))["classes"] == ["no", "yes"]


def test_latency_quantiles_fall_within_one_bin():
    latencies = np.random.default_rng(5).lognormal(mean=1.0, sigma=1.0, size=20_000)
    counts = np.bincount(np.searchsorted(LATENCY_EDGES, latencies, side="right"),
                         minlength=len(LATENCY_EDGES) + 1)
    for q in (0.5, 0.95):
        exact = np.quantile(latencies, q)
        assert exact / 1.13 <= latency_quantile(counts, q) <= exact * 1.13


def test_quality_drop_knows_which_way_is_worse():
    assert quality_drop("rmse", 50.0, 60.0) == pytest.approx(0.2)
    assert quality_drop("r2", 0.5, 0.4) == pytest.approx(0.2)
    assert quality_drop("accuracy", 0.9, 0.95) < 0
    assert np.isnan(quality_drop("rmse", 0.0, 1.0))


def test_check_profile_refuses_other_json():
    with pytest.raises(ValueError, match="not a dbspec reference profile"):
        check_profile({"a": 1})
    with pytest.raises(ValueError, match="newer"):
        check_profile({"columns": {}, "features": [], "format_version": 99})


def test_out_of_range_needs_more_than_a_small_reference_lets_through():
    """A 120-row reference leaves about 2/121 of new rows outside its range: a window of 120
    rows with 7 outside (5.8%) is chance, 30 outside is not."""
    rng = np.random.default_rng(9)
    profile = profile_column(rng.normal(size=120))
    lo, hi = profile["min"], profile["max"]
    inside = rng.uniform(lo, hi, size=120)
    for outside, alerts in ((7, False), (30, True)):
        values = inside.copy()
        values[:outside] = hi + 1.0
        result = compare_column("x", _accumulate(profile, values), Thresholds())
        assert result.out_of_range_rate == pytest.approx(outside / 120)
        assert any(c == "out_of_range" for c, _ in result.findings) is alerts


def test_tied_values_do_not_sit_on_an_edge_so_small_noise_is_not_drift():
    """A column with heavily repeated values (diabetes' s4): an edge on a repeated value put
    its whole mass on one side, and served values a hair off it (noise, a rounding) on the
    other: PSI 0.39 on unshifted rows with 2% noise. Edges now lie halfway between values."""
    from sklearn.datasets import load_diabetes

    from dbspec.monitoring.drift import ColumnAccumulator, ks_binned, psi
    from dbspec.monitoring.profile import profile_column

    column = load_diabetes().data[:, 7].astype(np.float32)
    profile = profile_column(column[:300])
    distinct = np.unique(column[:300].astype(np.float64))
    assert not np.isin(profile["fine_edges"], distinct).any()
    rng = np.random.default_rng(0)
    served = column[rng.integers(0, len(column), 20_000)]
    noisy = served + (rng.normal(size=len(served)) * column.std() * 0.02).astype(np.float32)
    window = ColumnAccumulator(profile)
    window.update(noisy)
    assert psi(np.array(profile["counts"]), window.counts) < 0.05
    assert ks_binned(np.array(profile["fine_counts"]), window.fine_counts)[0] < 0.1
    # the training counts are those of the quantile bins: equal shares, ties kept together
    assert sum(profile["counts"]) == 300 and max(profile["counts"]) < 300
