"""Data parallelism on torch.distributed: 2 Gloo processes on loopback against one process.

Each test starts the two ranks of ``distributed_worker.py`` (bounded in time) and compares what rank 0
wrote with the same case fitted here in one process: predictions and the primal and dual objectives
must agree to 1e-6 relative (the duality gap then agrees to 1e-6 of the objective).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import distributed_worker as worker  # noqa: E402

from joker_ext import JokerRegressor  # noqa: E402
from joker_ext.distributed import run_local_group  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built in")

WORKER = Path(__file__).with_name("distributed_worker.py")
TIMEOUT = 240


def _launch(scenario: str, out: Path, *, dies: bool = False) -> list:
    """Run both ranks of the worker (bounded in time); return their exit codes. ``dies``: rank 1 is expected
    to exit on its own, after which rank 0 (failing on, or waiting at, its next collective) is stopped."""
    logs = [open(out / f"rank{r}.log", "w") for r in range(2)]
    try:
        return run_local_group([str(WORKER), scenario, str(out)], 2, timeout=TIMEOUT, logs=logs,
                               stop_when_rank_exits=1 if dies else None, env=dict(os.environ, OMP_NUM_THREADS="1"))
    except TimeoutError as exc:
        raise AssertionError(f"{scenario}: {exc}; logs:\n" + _logs(out)) from None
    finally:
        for f in logs:
            f.close()


def _logs(out: Path) -> str:
    return "\n".join(f"--- rank {r}\n" + (out / f"rank{r}.log").read_text()[-3000:] for r in range(2))


def _assert_ok(codes, out):
    assert codes == [0, 0], f"exit codes {codes}; logs:\n" + _logs(out)


def _close(a, b, what):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    err = np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)
    assert err <= 1e-6, f"{what}: relative difference {err:.2e} between 2 processes and one"


def test_two_gloo_processes_give_the_single_process_model(tmp_path):
    _assert_ok(_launch("models", tmp_path), tmp_path)
    got = json.loads((tmp_path / "models.json").read_text())
    X, y, labels = worker.data()
    assert sorted(got) == sorted(worker.CASES)
    for name in worker.CASES:
        pred, primal, dual = worker.fit_case(name, X, y, labels, distributed=False)
        _close(got[name]["pred"], pred, f"{name}: predictions")
        _close(got[name]["primal"], primal, f"{name}: primal objective")
        _close(got[name]["dual"], dual, f"{name}: dual objective")
        gap_2, gap_1 = got[name]["primal"] + got[name]["dual"], primal + dual
        assert abs(gap_2 - gap_1) <= 1e-6 * abs(primal), f"{name}: duality gaps {gap_2:.3e} and {gap_1:.3e}"


def test_bad_setups_fail_on_every_rank_with_a_clear_error(tmp_path):
    _assert_ok(_launch("errors", tmp_path), tmp_path)
    for r in range(2):
        msg = json.loads((tmp_path / f"errors{r}.json").read_text())
        assert msg["widths"] is not None and "same number of features" in msg["widths"] and "[4, 5]" in msg["widths"]
        assert msg["empty"] is not None and "rank(s) [1] are empty" in msg["empty"]
        assert msg["exact"] is not None and "every row on one process" in msg["exact"]


def test_distributed_without_a_process_group_is_a_clear_error():
    X, y, _ = worker.data()
    with pytest.raises(ValueError, match="initialised torch.distributed process group"):
        JokerRegressor(n_features=20, distributed=True).fit(X[:50], y[:50])


def test_resume_after_a_rank_dies(tmp_path):
    codes = _launch("dies", tmp_path, dies=True)
    assert codes[1] == 17, f"rank 1 should have died at iteration 2, exit codes {codes}; logs:\n" + _logs(tmp_path)
    assert (tmp_path / "fit.ckpt").is_file(), "rank 0 wrote no checkpoint before rank 1 died"
    _assert_ok(_launch("resume", tmp_path), tmp_path)
    got = json.loads((tmp_path / "resumed.json").read_text())
    assert got["status"] == "converged"
    X, y, labels = worker.data()
    pred, _, _ = worker.fit_case("logistic", X, y, labels, distributed=False)
    _close(got["pred"], pred, "resumed fit: predictions")
