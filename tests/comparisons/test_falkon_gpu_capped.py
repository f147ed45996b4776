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
    assert [(r["lib"], r["cap_gib"]) for r in records] == [("falkon", 0.25), ("joker", math.inf), ("joker", 0.25)]
    falkon_rmse = records[0]["rmse"]
    for r in records[1:]:
        assert r["status"] == "converged" and r["solver"] == "newton"
        assert r["rmse"] <= 1.01 * falkon_rmse  # the same problem (random features instead of centres)
    assert "| JokerFalkon (converged) | 0.25 |" in capsys.readouterr().out


def test_table_ratios_are_against_falkons_fit_in_the_same_configuration():
    recs = [dict(config="c", lib="falkon", cap_gib=0.24, fit_time=20.0, peak_bytes=800 * 2**20, rmse=0.97),
            dict(config="c", lib="joker", cap_gib=0.24, fit_time=2.0, peak_bytes=200 * 2**20, rmse=0.96,
                 status="converged", planned={"newton_rank": 256}),
            dict(config="c", lib="joker", cap_gib=0.24, error="OutOfMemoryError: ...")]
    table = capped.render(recs)
    assert "| 2.00 | 0.100x | 0.96000 | 200.0 | 0.25x | {'newton_rank': 256} |" in table
    assert "OutOfMemoryError" in table
    with pytest.raises(SystemExit, match="one cap per configuration"):
        capped.main(["--configs", "a,b", "--caps", "0.2"])
