"""Checkpoints: atomic files without pickled code, and bitwise resume."""
import numpy as np
import pytest
import torch

from joker_ext.checkpoint import atomic_save, load_checkpoint, load_solver_state
from joker_ext.features import make_feature_map
from joker_ext.kernels import GaussianKernel
from joker_ext.losses import get_loss
from joker_ext.model import fit_dual
from joker_ext.solver import SolverOptions

from conftest import make_binary, make_regression


@pytest.mark.parametrize("mode", ["exact", "features"])
@pytest.mark.parametrize("loss_name", ["squared", "logistic"])
def test_resume_from_checkpoint_is_bitwise_identical(tmp_path, mode, loss_name):
    loss = get_loss(loss_name)
    X, y = (make_binary if loss.margin else make_regression)(n=300, seed=3)
    kernel = GaussianKernel(1.0)
    fmap = (lambda: None) if mode == "exact" else (lambda: make_feature_map(kernel, 64, seed=5))
    Xt, Y = torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1)
    c = torch.full((300,), 3.0, dtype=torch.float64)
    opts = lambda it: SolverOptions(block_size=50, max_iter=it, tol=0.0, seed=11, check_every=7)
    full = fit_dual(Xt, Y, loss=loss, c=c, kernel=kernel, feature_map=fmap(), options=opts(40), solver="dbcd_tr")
    ck = tmp_path / "solver.ckpt"
    part = fit_dual(Xt, Y, loss=loss, c=c, kernel=kernel, feature_map=fmap(), options=opts(17), solver="dbcd_tr",
                    checkpoint_path=ck, checkpoint_every=5)
    state = load_solver_state(ck)
    assert state["iteration"] == 15
    resumed = fit_dual(Xt, Y, loss=loss, c=c, kernel=kernel, feature_map=fmap(), options=opts(40), resume=ck, solver="dbcd_tr")
    assert resumed.result.n_iter == 40
    assert torch.equal(resumed.alpha, full.alpha)
    key = "f" if mode == "exact" else "beta"
    assert torch.equal(resumed.result.state[key], full.result.state[key])


def test_atomic_save_leaves_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "m.ckpt"
    atomic_save({"format": "joker_ext", "kind": "solver", "x": torch.ones(3)}, path)

    class Boom:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_save({"format": "joker_ext", "kind": "solver", "x": Boom()}, path)
    assert torch.equal(load_checkpoint(path)["x"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["m.ckpt"]  # no temporary file left behind


class Payload:
    """Stands for arbitrary code in a pickle."""


def test_loading_refuses_pickled_code(tmp_path):
    path = tmp_path / "evil.ckpt"
    torch.save({"format": "joker_ext", "kind": "solver", "obj": Payload()}, path)
    with pytest.raises(Exception, match="(?i)weights_only|unsupported|global"):
        load_checkpoint(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.ckpt")


def _kinked_feature_fit(tmp_path=None, max_iter=None, resume=None, C=10.0, **options):
    """Epsilon-insensitive loss on 64 random features, feature Newton (second-order engine with its continuation)."""
    rng = np.random.default_rng(0)
    n = 600
    X = torch.as_tensor(rng.standard_normal((n, 3)))
    Y = (torch.sin(2 * X[:, 0]) + 0.1 * torch.as_tensor(rng.standard_normal(n)) + 2.0).reshape(-1, 1)
    kernel = GaussianKernel(1.0)
    ck = None if tmp_path is None else tmp_path / "newton.ckpt"
    return fit_dual(X, Y, loss=get_loss("epsilon_insensitive"), c=torch.full((n,), C, dtype=torch.float64),
                    kernel=kernel, feature_map=make_feature_map(kernel, 64, seed=5), solver="newton",
                    options=SolverOptions(tol=1e-10, max_iter=max_iter, **options),
                    checkpoint_path=ck, checkpoint_every=None if ck is None else 1, resume=resume), ck


@pytest.mark.parametrize("stop", [1, 5, 9])
def test_second_order_engine_resumed_during_its_interior_start_ends_bitwise(tmp_path, stop):
    """A checkpoint written during feature Newton's interior start (kinked losses) runs the start again: the resumed
    fit is the uninterrupted one, bit for bit (continuing the smoothing from the checkpoint took 23 more iterations
    where the uninterrupted fit took 8, and ended elsewhere)."""
    full, _ = _kinked_feature_fit()
    assert full.result.status == "converged" and full.result.n_iter > 9
    _, ck = _kinked_feature_fit(tmp_path, max_iter=stop)
    saved = load_solver_state(ck)
    assert "interior_start" in saved["state"]
    resumed, _ = _kinked_feature_fit(resume=ck)
    assert torch.equal(resumed.alpha, full.alpha)
    assert torch.equal(resumed.result.state["beta"], full.result.state["beta"])
    assert resumed.result.n_iter == full.result.n_iter
    assert set(resumed.result.state) == {"beta"}  # the checkpoint's markers stay out of the result


def test_second_order_engine_resumes_its_continuation_where_the_checkpoint_left_it(tmp_path):
    """Without the interior start (a rank-32 preconditioner) the kinked loss runs the smoothing continuation: a
    checkpoint keeps its smoothing level and centre, and the resume goes on from that level to the same optimum;
    a checkpoint of another C starts the continuation over (from that problem's own first level)."""
    full, _ = _kinked_feature_fit(newton_rank=32)
    first = full.result.history[0]["smoothing"]
    assert full.result.status == "converged" and first > 0
    _, ck = _kinked_feature_fit(tmp_path, max_iter=30, newton_rank=32)
    saved = load_solver_state(ck)
    level = float(saved["state"]["continuation"][0])
    assert 0 < level < first / 100  # the continuation had moved on
    resumed, _ = _kinked_feature_fit(resume=ck, newton_rank=32)
    assert resumed.result.history[0]["smoothing"] == level
    assert resumed.result.status == "converged" and resumed.result.rel_gap <= 1e-10
    assert abs(resumed.result.primal - full.result.primal) <= 1e-9 * abs(full.result.primal)
    other, _ = _kinked_feature_fit(resume=ck, C=12.0, newton_rank=32)
    assert other.result.history[0]["smoothing"] == pytest.approx(first * 1.2)
    assert other.result.status == "converged"
