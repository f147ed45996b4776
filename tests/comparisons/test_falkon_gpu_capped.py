"""The capped GPU benchmark (``falkon_gpu_capped``): its CPU smoke run and its table's ratios."""
import json
import math

import pytest

from joker_ext.comparisons.benchmarks import falkon_gpu_capped as capped


def test_quick_run_fits_falkon_and_jokerfalkon_capped_and_uncapped(tmp_path, capsys):
    pytest.importorskip("falkon")
    out = tmp_path / "capped.jsonl"
    capped.main(["--quick", "--configs", "synth1m", "--caps", "0.25", "--repeats", "1", "--out", str(out)])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["lib"], r["cap_gib"]) for r in records] == [
        ("falkon", 0.25), ("joker", math.inf), ("joker_trace", math.inf), ("joker", 0.25), ("joker_trace", 0.25)]
    falkon_rmse = records[0]["rmse"]
    for r in records[1:]:
        if r["lib"] == "joker_trace":
            # the first report at or below Falkon's RMSE, inside the fit
            hit = [t for t, e in r["trace"] if e <= falkon_rmse]
            assert r["time_to_target"] == (hit[0] if hit else None)
            assert r["best_rmse"] == min(e for _, e in r["trace"])
            assert r["trace"][-1][0] <= r["fit_time_excl_reporting"]
            continue
        assert r["status"] == "converged" and r["solver"] == "newton"
        assert r["rmse"] <= 1.01 * falkon_rmse  # the same problem (random features instead of centres)
    out = capsys.readouterr().out
    assert "| JokerFalkon (converged) | 0.25 |" in out and "| JokerFalkon to Falkon's RMSE | 0.25 |" in out


def test_table_ratios_are_against_falkons_fit_in_the_same_configuration():
    recs = [dict(config="c", lib="falkon", cap_gib=0.24, fit_time=20.0, peak_bytes=800 * 2**20, rmse=0.97),
            dict(config="c", lib="joker", cap_gib=0.24, fit_time=2.0, peak_bytes=200 * 2**20, rmse=0.96,
                 status="converged", planned={"newton_rank": 256}),
            dict(config="c", lib="joker", cap_gib=0.24, error="OutOfMemoryError: ..."),
            dict(config="c", lib="joker_trace", cap_gib=0.24, time_to_target=1.0, best_rmse=0.95)]
    table = capped.render(recs)
    assert "| 2.00 | 0.100x | 0.96000 | 200.0 | 0.25x | {'newton_rank': 256} |" in table
    assert "| 1.00 s (0.050x Falkon's fit time) |" in table
    assert "OutOfMemoryError" in table
    with pytest.raises(SystemExit, match="one cap per configuration"):
        capped.main(["--configs", "a,b", "--caps", "0.2"])
