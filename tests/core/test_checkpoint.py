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
