"""Bad and extreme input at every public entry point that is not a scikit-learn estimator: JokerFalkon,
JokerLogisticFalkon, JokerGP and the comparison harness (spec, TOML, command-line flags, runner).

Issue #9's list, one parametrised case (or more) per item and entry point: shapes, NaN / inf, empty input,
n smaller than a block, one class, continuous labels to a classifier, string or object arrays, wrong widths
at predict, non-contiguous / integer / float16 input, mismatched X / Y, C / penalty / sigma <= 0, loss
parameters out of range, unknown loss / kernel / dtype / device, an unsupported kernel object, a missing
optional package. Each bad case must raise the documented exception (ValueError / TypeError, ImportError
for a missing package) and its message must name the argument. Valid-but-odd input (n smaller than a
block, non-contiguous, integer, float16 where accepted) must fit and give what the clean input gives.

The hypothesis tests at the end fuzz the public APIs of JokerFalkon / JokerLogisticFalkon and JokerGP: every
outcome is a result or a documented exception, never an exception from deep inside and never a NaN in a
prediction. Run with ``-s`` to print the counts (quoted in docs/api/validation.rst).
"""
from __future__ import annotations

import re
import sys
import types
import warnings
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from joker_ext import GaussianKernel
from joker_ext.adapters.falkon import JokerFalkon, JokerLogisticFalkon

#: Every ValueError / TypeError message names the argument, what it must be and what came in.
_FORM = re.compile(r"^\S.* (must|needs?) .*(got|has|have)")

N, D = 24, 3
_g = torch.Generator().manual_seed(0)
X = torch.randn(N, D, generator=_g, dtype=torch.float64)
Y = torch.sin(X[:, :1]) + 0.1 * torch.randn(N, 1, generator=_g, dtype=torch.float64)
YPM = torch.where(X[:, :1] > 0, 1.0, -1.0).to(torch.float64)
K = GaussianKernel(1.0)


def _with_nan(A, value=float("nan")):
    A = A.clone()
    A.view(-1)[3] = value
    return A


def _jf(**kw):
    args = dict(kernel=K, penalty=1e-3, M=8)
    args.update({k: kw.pop(k) for k in list(kw) if k in args})
    kw.setdefault("maxiter", 1)
    kw.setdefault("seed", 0)
    return JokerFalkon(args["kernel"], args["penalty"], args["M"], **kw)


def _jlf(loss="logistic", **kw):
    args = dict(kernel=K, penalty_list=[1e-2, 1e-3], iter_list=[1, 1], M=8)
    args.update({k: kw.pop(k) for k in list(kw) if k in args})
    kw.setdefault("seed", 0)
    return JokerLogisticFalkon(args["kernel"], args["penalty_list"], args["iter_list"], loss, args["M"], **kw)


def _falkon():
    return pytest.importorskip("falkon")


def _falkon_loss_subclass():
    gl = _falkon().gsc_losses

    class _MyLogistic(gl.LogisticLoss):  # may compute anything: not translated
        pass

    return _MyLogistic(_falkon().kernels.GaussianKernel(1.0))


_FITTED = {}


def _fitted_jf():
    if "jf" not in _FITTED:
        _FITTED["jf"] = _jf().fit(X, Y)
    return _FITTED["jf"]


def _check(fn, exc, pattern):
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    assert re.search(pattern, msg), f"message does not name {pattern!r}: {msg}"
    if exc is not ImportError:
        assert _FORM.search(msg), f"message not of the form '<argument> must be <expected>, got <input>': {msg}"
    return msg


# ============================================================================ JokerFalkon / JokerLogisticFalkon
FALKON_CASES = [
    # item: shapes
    ("shapes", "X 1-D", lambda: _jf().fit(X[:, 0], Y), ValueError, r"^X must be 2-D"),
    ("shapes", "X 3-D", lambda: _jf().fit(X[:, :, None], Y), ValueError, r"^X must be 2-D"),
    ("shapes", "Y 3-D", lambda: _jf().fit(X, Y[:, :, None]), ValueError, r"^Y must be 1-D .* or 2-D"),
    ("shapes", "warm_start shape", lambda: _jf().fit(X, Y, warm_start=torch.zeros(N, 2, dtype=X.dtype)),
     ValueError, r"^warm_start must be"),
    ("shapes", "Xts 1-D", lambda: _jf().fit(X, Y, Xts=X[:, 0], Yts=Y), ValueError, r"^Xts must be 2-D"),
    ("shapes", "Yts columns", lambda: _jf().fit(X, Y, Xts=X, Yts=torch.cat([Y, Y], 1)), ValueError, r"^Yts must"),
    ("shapes", "JLF two responses", lambda: _jlf().fit(X, torch.cat([YPM, YPM], 1)), ValueError, r"Y must be 1-D"),
    # item: NaN / inf
    ("nan", "X NaN", lambda: _jf().fit(_with_nan(X), Y), ValueError, r"^X must be finite, got NaN"),
    ("nan", "X inf", lambda: _jf().fit(_with_nan(X, float("inf")), Y), ValueError, r"^X must be finite"),
    ("nan", "Y NaN", lambda: _jf().fit(X, _with_nan(Y)), ValueError, r"^Y must be finite"),
    ("nan", "Y -inf", lambda: _jf().fit(X, _with_nan(Y, -float("inf"))), ValueError, r"^Y must be finite"),
    ("nan", "Xts NaN", lambda: _jf().fit(X, Y, Xts=_with_nan(X), Yts=Y), ValueError, r"^Xts must be finite"),
    ("nan", "Yts NaN", lambda: _jf().fit(X, Y, Xts=X, Yts=_with_nan(Y)), ValueError, r"^Yts must be finite"),
    ("nan", "warm_start NaN", lambda: _jf().fit(X, Y, warm_start=_with_nan(torch.zeros(N, 1, dtype=X.dtype))),
     ValueError, r"^warm_start must be finite"),
    ("nan", "predict NaN", lambda: _fitted_jf().predict(_with_nan(X)), ValueError, r"^X must be finite"),
    ("nan", "JLF X NaN", lambda: _jlf().fit(_with_nan(X), YPM), ValueError, r"^X must be finite"),
    ("nan", "X too large for float32", lambda: _jf(dtype="float32").fit(X * 1e30, Y), ValueError,
     r"^X must have values of magnitude below"),
    ("nan", "weight_fn NaN", lambda: _jf(weight_fn=lambda y, x, i: torch.full((N,), float("nan"))).fit(X, Y),
     ValueError, r"^weight_fn output must be finite"),
    # item: empty input
    ("empty", "no rows", lambda: _jf().fit(X[:0], Y[:0]), ValueError, r"^X must have at least 1 row"),
    ("empty", "no columns", lambda: _jf().fit(X[:, :0], Y), ValueError, r"^X must have at least 1 row\(s\) and 1 col"),
    ("empty", "Y no columns", lambda: _jf().fit(X, Y[:, :0]), ValueError, r"^Y must have at least one target"),
    ("empty", "JLF empty path", lambda: _jlf(penalty_list=[], iter_list=[]).fit(X, YPM), ValueError,
     r"^penalty_list must be a non-empty list"),
    ("empty", "predict no rows", lambda: _fitted_jf().predict(X[:0]), ValueError, r"^X must have at least 1 row"),
    # item: one class
    ("one_class", "hinge one class", lambda: _jf(loss="hinge").fit(X, torch.ones(N, 1, dtype=X.dtype)),
     ValueError, r"^Y must contain at least two classes"),
    ("one_class", "JLF one class", lambda: _jlf().fit(X, -torch.ones(N, 1, dtype=X.dtype)), ValueError,
     r"^Y must contain at least two classes"),
    # item: continuous labels to a classifier
    ("continuous_labels", "hinge", lambda: _jf(loss="hinge").fit(X, Y), ValueError,
     r"^Y must hold class labels in \{-1, \+1\}"),
    ("continuous_labels", "JLF logistic", lambda: _jlf().fit(X, Y), ValueError, r"^Y must hold class labels"),
    ("continuous_labels", "JLF 0/1 for LogisticLoss", lambda: _jlf().fit(X, (YPM > 0).to(X.dtype)), ValueError,
     r"^Y must hold class labels in \{-1, \+1\}"),
    # item: string or object arrays
    ("strings", "X strings", lambda: _jf().fit(X.numpy().astype(str), Y), TypeError, r"^X must contain numbers"),
    ("strings", "X objects", lambda: _jf().fit(X.numpy().astype(object), Y), TypeError, r"^X must contain numbers"),
    ("strings", "Y strings", lambda: _jf().fit(X, np.array(["a", "b"] * (N // 2))), TypeError,
     r"^Y must contain numbers"),
    ("strings", "X a str", lambda: _jf().fit("X.csv", Y), TypeError, r"^X must be a torch tensor"),
    ("strings", "X None", lambda: _jf().fit(None, Y), TypeError, r"^X must be an array or tensor"),
    ("strings", "X complex", lambda: _jf().fit(X.to(torch.complex128), Y), TypeError, r"^X must be real"),
    ("strings", "X sparse", lambda: _jf().fit(X.to_sparse(), Y), TypeError, r"^X must be a dense tensor"),
    # item: wrong widths at predict
    ("width", "predict d-1", lambda: _fitted_jf().predict(X[:, :2]), ValueError, r"^X has 2 features.*fitted with 3"),
    ("width", "Xts d+1", lambda: _jf().fit(X, Y, Xts=torch.cat([X, X], 1), Yts=Y), ValueError, r"^Xts has 6 features"),
    # item: integer / float16 input (Falkon requires float32 / float64 tensors, so does its drop-in)
    ("int_float16", "X int64", lambda: _jf().fit(X.long(), Y), TypeError, r"^X must be a float32 or float64"),
    ("int_float16", "X float16", lambda: _jf().fit(X.half(), Y), TypeError, r"^X must be a float32 or float64"),
    ("int_float16", "predict int", lambda: _fitted_jf().predict(X.long()), TypeError, r"^X must be a float32"),
    # item: mismatched X / Y
    ("mismatch", "Y short", lambda: _jf().fit(X, Y[:-1]), ValueError, r"^Y has 23 rows but X has 24"),
    ("mismatch", "Yts short", lambda: _jf().fit(X, Y, Xts=X, Yts=Y[:-1]), ValueError, r"^Yts has 23 rows but Xts"),
    ("mismatch", "Xts without Yts", lambda: _jf().fit(X, Y, Xts=X), ValueError, r"^Xts and Yts must be given"),
    ("mismatch", "weight_fn length", lambda: _jf(weight_fn=lambda y, x, i: torch.ones(N - 1)).fit(X, Y), ValueError,
     r"^weight_fn output must be a tensor of shape"),
    ("mismatch", "JLF path lengths", lambda: _jlf(iter_list=[1]).fit(X, YPM), ValueError,
     r"^iter_list must have the same length"),
    # item: C / penalty / sigma <= 0
    ("nonpositive", "penalty 0", lambda: _jf(penalty=0.0).fit(X, Y), ValueError, r"^penalty must be positive"),
    ("nonpositive", "penalty -1", lambda: _jf(penalty=-1.0).fit(X, Y), ValueError, r"^penalty must be positive"),
    ("nonpositive", "penalty NaN", lambda: _jf(penalty=float("nan")).fit(X, Y), ValueError, r"^penalty must be"),
    ("nonpositive", "penalty str", lambda: _jf(penalty="1e-3").fit(X, Y), TypeError, r"^penalty must be a positive"),
    ("nonpositive", "JLF penalty_list", lambda: _jlf(penalty_list=[1e-2, 0.0]).fit(X, YPM), ValueError,
     r"^penalty_list\[1\] must be positive"),
    ("nonpositive", "Falkon sigma -1", lambda: _jf(kernel=_falkon().kernels.GaussianKernel(-1.0)).fit(X, Y),
     ValueError, r"^sigma must be positive"),
    ("nonpositive", "Falkon sigma 0", lambda: _jf(kernel=_falkon().kernels.LaplacianKernel(0.0)).fit(X, Y),
     ValueError, r"^sigma must be positive"),
    ("nonpositive", "penalty underflows C in float32", lambda: _jf(penalty=1e-300, dtype="float32").fit(X, Y),
     ValueError, r"^C = 1 / \(n \* penalty\) .* must be between .* in torch.float32 .*got 4.17e\+298 \(penalty=1e-300"),
    ("nonpositive", "penalty overflows the dual in float64", lambda: _jf(penalty=1e-300, loss="logistic").fit(X, YPM),
     ValueError, r"^C = 1 / \(n \* penalty\) .* must be between 2.2.*e-308 and .* in torch.float64"),
    ("nonpositive", "JLF penalty in float32", lambda: _jlf(penalty_list=[1e-2, 1e-300], dtype="float32").fit(X, YPM),
     ValueError, r"^C = 1 / \(n \* penalty_list\[1\]\)"),
    ("nonpositive", "M 0", lambda: _jf(M=0).fit(X, Y), ValueError, r"^M must be a positive integer"),
    ("nonpositive", "M str", lambda: _jf(M="many").fit(X, Y), TypeError, r"^M must be a positive integer"),
    ("nonpositive", "maxiter 0", lambda: _jf(maxiter=0).fit(X, Y), ValueError, r"^maxiter must be a positive"),
    ("nonpositive", "block_size 0", lambda: _jf(block_size=0).fit(X, Y), ValueError, r"^block_size must be"),
    ("nonpositive", "epochs_per_iter 0", lambda: _jf(epochs_per_iter=0).fit(X, Y), ValueError,
     r"^epochs_per_iter must be"),
    ("nonpositive", "JLF iter_list 0", lambda: _jlf(iter_list=[1, 0]).fit(X, YPM), ValueError,
     r"^iter_list\[1\] must be a positive integer"),
    ("nonpositive", "tol -1", lambda: _jf(tol=-1.0).fit(X, Y), ValueError, r"^tol must be non-negative"),
    ("nonpositive", "max_time 0", lambda: _jf(max_time=0).fit(X, Y), ValueError, r"^max_time must be positive"),
    ("nonpositive", "seed -1", lambda: _jf(seed=-1).fit(X, Y), ValueError, r"^seed must be an integer >= 0"),
    ("nonpositive", "weights negative", lambda: _jf(weight_fn=lambda y, x, i: -torch.ones(N)).fit(X, Y),
     ValueError, r"^weight_fn output must be finite and non-negative"),
    ("nonpositive", "weights zero", lambda: _jf(weight_fn=lambda y, x, i: torch.zeros(N)).fit(X, Y), ValueError,
     r"^weight_fn output must have at least one positive"),
    ("nonpositive", "neg_weight", lambda: _jlf(loss=_falkon().gsc_losses.WeightedCrossEntropyLoss(
        _falkon().kernels.GaussianKernel(1.0), neg_weight=-1.0)).fit(X, (YPM > 0).to(X.dtype)), ValueError,
     r"^WeightedCrossEntropyLoss neg_weight must be positive"),
    # item: loss parameters out of range
    ("loss_params", "quantile 1.5", lambda: _jf(loss="pinball", quantile=1.5).fit(X, Y), ValueError,
     r"^quantile must be in \(0, 1\)"),
    ("loss_params", "quantile 0", lambda: _jf(loss="pinball", quantile=0.0).fit(X, Y), ValueError, r"^quantile must"),
    ("loss_params", "quantile unused", lambda: _jf(quantile=-0.5).fit(X, Y), ValueError, r"^quantile must"),
    ("loss_params", "epsilon -1", lambda: _jf(loss="epsilon_insensitive", epsilon=-1.0).fit(X, Y), ValueError,
     r"^epsilon must be non-negative"),
    ("loss_params", "delta 0", lambda: _jf(loss="huber", delta=0.0).fit(X, Y), ValueError, r"^delta must be positive"),
    ("loss_params", "delta -1", lambda: _jf(loss="huber", delta=-1.0).fit(X, Y), ValueError, r"^delta must be"),
    ("loss_params", "delta str", lambda: _jf(loss="huber", delta="big").fit(X, Y), TypeError, r"^delta must be"),
    # item: unknown loss / kernel / dtype / device
    ("unknown", "loss name", lambda: _jf(loss="cubic").fit(X, Y), ValueError, r"^loss must be one of .*unknown loss"),
    ("unknown", "loss type", lambda: _jf(loss=3).fit(X, Y), TypeError, r"^loss must be a registered loss"),
    ("unknown", "JLF loss object", lambda: _jlf(loss=object()).fit(X, YPM), TypeError, r"^loss must be"),
    ("unknown", "JLF loss name", lambda: _jlf(loss="cubic").fit(X, YPM), ValueError, r"^loss must be one of"),
    ("unknown", "kernel name", lambda: _jf(kernel="rbf").fit(X, Y), TypeError, r"^kernel must be a Falkon kernel"),
    ("unknown", "dtype float16", lambda: _jf(dtype="float16").fit(X, Y), ValueError, r"^dtype must be 'float32'"),
    ("unknown", "dtype int", lambda: _jf(dtype=torch.int64).fit(X, Y), ValueError, r"^dtype must be"),
    ("unknown", "device name", lambda: _jf(device="nodevice").fit(X, Y), ValueError, r"^device must be a torch dev"),
    ("unknown", "device type", lambda: _jf(device=3.5).fit(X, Y), TypeError, r"^device must be a torch device"),
    ("unknown", "features", lambda: _jf(features="fourier").fit(X, Y), ValueError, r"^features must be one of"),
    ("nan", "centres NaN", lambda: _jf(center_selection=_with_nan(X[:5]), features="nystrom", M=None).fit(X, Y),
     ValueError, r"^center_selection \(the centres\) must be finite"),
    ("width", "centres width", lambda: _jf(center_selection=X[:5, :2], features="nystrom", M=None).fit(X, Y),
     ValueError, r"^center_selection \(the centres\) has 2 features"),
    ("unknown", "center_selection", lambda: _jf(center_selection="kmeans", features="nystrom").fit(X, Y),
     ValueError, r"^center_selection must be"),
    ("unknown", "keops_active", lambda: _jf(options=types.SimpleNamespace(keops_active="maybe")).fit(X, Y),
     ValueError, r"^options.keops_active must be one of"),
    ("unknown", "memory_slack", lambda: _jf(options=types.SimpleNamespace(memory_slack=2.0)).fit(X, Y), ValueError,
     r"^options.memory_slack must be"),
    ("unknown", "max_cpu_mem", lambda: _jf(options=types.SimpleNamespace(max_cpu_mem=0)).fit(X, Y), ValueError,
     r"^options.max_cpu_mem must be"),
    ("unknown", "error_fn", lambda: _jf(error_fn="mse").fit(X, Y), TypeError, r"^error_fn must be callable"),
    ("unknown", "weight_fn", lambda: _jf(weight_fn=np.ones(N)).fit(X, Y), TypeError, r"^weight_fn must be callable"),
    # item: unsupported kernel object
    ("kernel_object", "object()", lambda: _jf(kernel=object()).fit(X, Y), TypeError,
     r"^kernel must be a Falkon kernel .*builtins.object"),
    ("kernel_object", "sklearn kernel", lambda: _jf(kernel=__import__("sklearn.gaussian_process.kernels",
                                                                      fromlist=["RBF"]).RBF()).fit(X, Y),
     TypeError, r"^kernel must be a Falkon kernel"),
    ("kernel_object", "a namespace", lambda: _jf(kernel=types.SimpleNamespace(sigma=1.0)).fit(X, Y), TypeError,
     r"^kernel must be"),
    ("kernel_object", "Falkon loss subclass", lambda: _jlf(loss=_falkon_loss_subclass()).fit(X, YPM), TypeError,
     r"^loss must be falkon.gsc_losses.LogisticLoss.* got _MyLogistic \(it has no joker_ext translation\)"),
    ("kernel_object", "no spectral density", lambda: _jf(kernel=_falkon().kernels.LinearKernel(),
                                                         features="cossin").fit(X, Y),
     ValueError, r"features='cossin' needs a kernel with a spectral density"),
]


@pytest.mark.parametrize("item,what,fn,exc,pattern", FALKON_CASES, ids=[f"{c[0]}-{c[1]}" for c in FALKON_CASES])
def test_falkon_faces_refuse_bad_input(item, what, fn, exc, pattern):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _check(fn, exc, pattern)


def test_falkon_items_all_covered():
    items = {c[0] for c in FALKON_CASES}
    assert items >= {"shapes", "nan", "empty", "one_class", "continuous_labels", "strings", "width", "int_float16",
                     "mismatch", "nonpositive", "loss_params", "unknown", "kernel_object"}


@pytest.mark.parametrize("n", [1, 3])
def test_falkon_n_smaller_than_a_block(n):
    """n far below the block size (and below M): one block of n rows, finite predictions. With a single
    block and the exact kernel the squared-loss fit is kernel ridge regression: compare with the closed
    form (alpha = (K + I / C)^-1 y, C = 1 / (n penalty))."""
    Xs, Ys = X[:n], Y[:n]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = _jf(features="exact", maxiter=50, block_size=2048, tol=0.0).fit(Xs, Ys)
        assert m.block_size_ == n
        C = 1.0 / (n * 1e-3)
        Kn = K(Xs, Xs)
        ref = Kn @ torch.linalg.solve(Kn + torch.eye(n, dtype=X.dtype) / C, Ys)
        torch.testing.assert_close(m.predict(Xs), ref, rtol=1e-6, atol=1e-8)
        for features in ("cossin", "nystrom"):
            p = _jf(features=features, M=50).fit(Xs, Ys).predict(X)
            assert p.shape == (N, 1) and bool(torch.isfinite(p).all())
        p = _jlf().fit(X[:2], torch.tensor([[1.0], [-1.0]], dtype=X.dtype)).predict(X)
        assert bool(torch.isfinite(p).all())


def test_falkon_noncontiguous_numpy_and_float32_match_clean_input():
    ref = _jf(features="exact", maxiter=3).fit(X, Y).predict(X)
    Xf = X.t().contiguous().t()  # Fortran order: not contiguous
    assert not Xf.is_contiguous()
    torch.testing.assert_close(_jf(features="exact", maxiter=3).fit(Xf, Y[:, 0]).predict(Xf), ref)
    torch.testing.assert_close(_jf(features="exact", maxiter=3).fit(X.numpy(), Y.numpy()).predict(X), ref)
    # integer targets are numbers: accepted and converted to X's dtype
    Yi = torch.round(3 * Y).long()
    a = _jf(features="exact", maxiter=3).fit(X, Yi).predict(X)
    b = _jf(features="exact", maxiter=3).fit(X, Yi.to(X.dtype)).predict(X)
    torch.testing.assert_close(a, b)
    # float32 data: predictions in float32, the fit in float64 (Falkon's convention)
    p32 = _jf(features="exact", maxiter=3).fit(X.float(), Y.float()).predict(X.float())
    assert p32.dtype == torch.float32
    torch.testing.assert_close(p32.double(), ref, rtol=1e-4, atol=1e-5)


def test_falkon_missing_is_not_needed_and_named(monkeypatch):
    """JokerFalkon never imports Falkon: with `import falkon` failing, joker kernels still fit, and an
    object that is not a kernel is refused with a TypeError saying that Falkon kernels need the falkon
    package and where to get it. options.keops_active='force' without pykeops: ImportError naming it."""
    for name in [m for m in sys.modules if m == "falkon" or m.startswith("falkon.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "falkon", None)
    with pytest.raises(ImportError):
        __import__("falkon")
    p = _jf().fit(X, Y).predict(X)
    assert bool(torch.isfinite(p).all())
    msg = _check(lambda: _jf(kernel="GaussianKernel").fit(X, Y), TypeError, r"^kernel must be a Falkon kernel")
    assert "falkon package" in msg and "install" in msg
    monkeypatch.setitem(sys.modules, "pykeops", None)
    monkeypatch.setitem(sys.modules, "pykeops.torch", None)
    msg = _check(lambda: _jf(options=types.SimpleNamespace(keops_active="force")).fit(X, Y), ImportError,
                 r"keops_active='force' needs the optional package 'pykeops'")
    assert "pip install" in msg


def test_prediction_guard_never_returns_nan_or_overflow():
    """The last guard of predict (joker_ext.validation.check_predictions): an output that is not finite, or
    that the input's dtype cannot hold, is refused with a ValueError naming the input."""
    from joker_ext.validation import check_predictions

    _check(lambda: check_predictions(torch.tensor([[0.0], [float("nan")]])), ValueError,
           r"^X must give finite predictions, got NaN or infinity")
    _check(lambda: check_predictions(torch.tensor([[1e100]], dtype=torch.float64), dtype=torch.float32), ValueError,
           r"^X must be float64 for these predictions \(up to 1e\+100, beyond the torch.float32 range\), got")
    out = check_predictions(torch.tensor([[1.5]], dtype=torch.float64), dtype=torch.float32)
    assert out.dtype == torch.float32 and float(out) == 1.5


# ============================================================================ JokerGP
@pytest.fixture(scope="module")
def gp(pair_dataset):
    gpytorch = pytest.importorskip("gpytorch")
    from joker_ext.adapters.gpytorch import JokerGP, RationalQuadraticKernel

    k = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    lik = gpytorch.likelihoods.GaussianLikelihood().double()
    lik.noise = 0.1
    ns = types.SimpleNamespace(gpytorch=gpytorch, JokerGP=JokerGP, RQ=RationalQuadraticKernel, k=k, lik=lik,
                               bern=gpytorch.likelihoods.BernoulliLikelihood(), x=X, y=Y[:, 0])
    ns.pairs = pair_dataset
    ns.make = lambda **kw: JokerGP(kw.pop("covar", k), kw.pop("lik", lik), kw.pop("mean", None), **kw)
    ns.fitted = ns.make().fit(X, Y[:, 0])
    return ns


y0 = Y[:, 0]
y01 = (YPM[:, 0] > 0).to(torch.float64)
GP_CASES = [
    ("shapes", "train_x 3-D", lambda g: g.make().fit(X[:, :, None], y0), ValueError,
     r"^train_x must have shape \(n, d\) or \(n,\)"),
    ("shapes", "train_y 2-D", lambda g: g.make().fit(X, Y), ValueError, r"^train_y must be 1-D of length n=24"),
    ("shapes", "test_x 3-D", lambda g: g.fitted.predict(X[:, :, None]), ValueError, r"^test_x must have shape"),
    ("nan", "train_x NaN", lambda g: g.make().fit(_with_nan(X), y0), ValueError, r"^train_x must be finite"),
    ("nan", "train_y inf", lambda g: g.make().fit(X, _with_nan(y0, float("inf"))), ValueError,
     r"^train_y must be finite"),
    ("nan", "test_x NaN", lambda g: g.fitted.predict(_with_nan(X)), ValueError, r"^test_x must be finite"),
    ("nan", "Dataset NaN", lambda g: g.make(n_features=16).fit(g.pairs(_with_nan(X), y0)), ValueError,
     r"^train_x \(rows 0 to 23\) must be finite"),
    ("nan", "float32 overflow", lambda g: g.make(dtype="float32").fit(X * 1e30, y0), ValueError,
     r"^train_x must have values of magnitude below"),
    ("empty", "no rows", lambda g: g.make().fit(X[:0], y0[:0]), ValueError, r"^train_x must have at least 1 row"),
    ("empty", "no columns", lambda g: g.make().fit(X[:, :0], y0), ValueError, r"^train_x must have at least 1 row"),
    ("empty", "empty Dataset", lambda g: g.make().fit(g.pairs(X[:0], y0[:0])), ValueError, r"^train_x must have at least one row, got an empty Dataset"),
    ("empty", "no train_y", lambda g: g.make().fit(X), TypeError, r"^train_y must be an array"),
    ("one_class", "Bernoulli one class", lambda g: g.make(lik=g.bern).fit(X, torch.ones(N, dtype=X.dtype)),
     ValueError, r"^train_y must contain at least two classes"),
    ("continuous_labels", "Bernoulli continuous", lambda g: g.make(lik=g.bern).fit(X, y0), ValueError,
     r"^train_y must hold class labels in \{0, 1\} or \{-1, \+1\}"),
    ("continuous_labels", "Bernoulli hinge 0/2", lambda g: g.make(lik=g.bern, loss="hinge").fit(X, 2 * y01),
     ValueError, r"^train_y must hold class labels"),
    ("strings", "train_x strings", lambda g: g.make().fit(X.numpy().astype(str), y0), TypeError,
     r"^train_x must contain numbers"),
    ("strings", "train_y objects", lambda g: g.make().fit(X, y0.numpy().astype(object)), TypeError,
     r"^train_y must contain numbers"),
    ("strings", "test_x strings", lambda g: g.fitted.predict(X.numpy().astype(str)), TypeError,
     r"^test_x must contain numbers"),
    ("strings", "train_x a str", lambda g: g.make().fit("data.csv", y0), TypeError, r"^train_x must be a tensor"),
    ("width", "test_x d-1", lambda g: g.fitted.predict(X[:, :2]), ValueError, r"^test_x has 2 features"),
    ("mismatch", "train_y short", lambda g: g.make().fit(X, y0[:-1]), ValueError,
     r"^train_y has 23 values but train_x has 24 rows"),
    ("mismatch", "FixedNoise length", lambda g: g.make(lik=g.gpytorch.likelihoods.FixedNoiseGaussianLikelihood(
        noise=torch.full((N - 2,), 0.1))).fit(X, y0), ValueError, r"^FixedNoiseGaussianLikelihood noise must have"),
    ("nonpositive", "C 0", lambda g: g.make(C=0.0).fit(X, y0), ValueError, r"^C must be positive"),
    ("nonpositive", "C -1", lambda g: g.make(C=-1.0).fit(X, y0), ValueError, r"^C must be positive"),
    ("nonpositive", "C nan", lambda g: g.make(C=float("nan")).fit(X, y0), ValueError, r"^C must be positive"),
    ("nonpositive", "noise NaN", lambda g: g.make(lik=g.gpytorch.likelihoods.FixedNoiseGaussianLikelihood(
        noise=torch.full((N,), float("nan")))).fit(X, y0), ValueError, r"^likelihood.noise must be positive"),
    ("nonpositive", "C too large for float32", lambda g: g.make(C=1e300, dtype="float32").fit(X, y0), ValueError,
     r"^C must be between .* in torch.float32 .* got 1e\+300"),
    ("nonpositive", "C overflows the dual in float64", lambda g: g.make(C=1e200).fit(X, y0), ValueError,
     r"^C must be between .* in torch.float64 .* got 1e\+200"),
    ("nonpositive", "RQ alpha -1", lambda g: g.RQ(1.0, alpha=-1.0), ValueError, r"^alpha must be positive"),
    ("nonpositive", "RQ outputscale 0", lambda g: g.RQ(1.0, outputscale=0.0), ValueError, r"^outputscale must be"),
    ("nonpositive", "n_features 0", lambda g: g.make(n_features=0).fit(X, y0), ValueError,
     r"^n_features must be a positive integer"),
    ("nonpositive", "block_size 0", lambda g: g.make(block_size=0).fit(X, y0), ValueError, r"^block_size must be"),
    ("nonpositive", "max_iter 0", lambda g: g.make(max_iter=0).fit(X, y0), ValueError, r"^max_iter must be"),
    ("nonpositive", "tol -1", lambda g: g.make(tol=-1.0).fit(X, y0), ValueError, r"^tol must be non-negative"),
    ("nonpositive", "seed None", lambda g: g.make(seed=None).fit(X, y0), TypeError, r"^seed must be an integer"),
    ("nonpositive", "max_time 0", lambda g: g.make(max_time=0).fit(X, y0), ValueError, r"^max_time must be"),
    ("loss_params", "quantile 1", lambda g: g.make(loss="pinball", quantile=1.0).fit(X, y0), ValueError,
     r"^quantile must be in \(0, 1\)"),
    ("loss_params", "epsilon -0.1", lambda g: g.make(loss="epsilon_insensitive", epsilon=-0.1).fit(X, y0),
     ValueError, r"^epsilon must be non-negative"),
    ("loss_params", "delta 0", lambda g: g.make(loss="huber", delta=0.0).fit(X, y0), ValueError,
     r"^delta must be positive"),
    ("unknown", "loss name", lambda g: g.make(loss="cubic").fit(X, y0), ValueError, r"^loss must be one of"),
    ("unknown", "loss type", lambda g: g.make(loss=1).fit(X, y0), TypeError, r"^loss must be a registered"),
    ("unknown", "regression loss with Bernoulli", lambda g: g.make(lik=g.bern, loss="huber").fit(X, y01),
     ValueError, r"^loss must be a classification loss .* got the regression loss 'huber'"),
    ("unknown", "likelihood", lambda g: g.make(lik=g.gpytorch.likelihoods.StudentTLikelihood()).fit(X, y0),
     TypeError, r"^likelihood must be a gpytorch"),
    ("unknown", "mean_module", lambda g: g.make(mean="zero").fit(X, y0), TypeError, r"^mean_module must be"),
    ("unknown", "dtype float16", lambda g: g.make(dtype=torch.float16).fit(X, y0), ValueError, r"^dtype must be"),
    ("unknown", "device", lambda g: g.make(device="gpu0").fit(X, y0), ValueError, r"^device must be a torch"),
    ("unknown", "features", lambda g: g.make(features="rff").fit(X, y0), ValueError, r"^features must be one of"),
    ("kernel_object", "joker kernel", lambda g: g.make(covar=K).fit(X, y0), TypeError,
     r"^kernel must be a gpytorch.kernels.Kernel"),
    ("kernel_object", "a string", lambda g: g.make(covar="rbf").fit(X, y0), TypeError, r"^kernel must be a gpytorch"),
    ("kernel_object", "no random features", lambda g: g.make(covar=g.gpytorch.kernels.LinearKernel(),
                                                             n_features=16).fit(X, y0),
     ValueError, r"need RBF, Matern or RQ kernels"),
    ("kernel_object", "batched kernel", lambda g: g.make(covar=g.gpytorch.kernels.RBFKernel(
        batch_shape=torch.Size([2]))).fit(X, y0), ValueError, r"^kernel must have an empty batch_shape \(batched GPyTorch kernels .* got batch_shape=\(2,\)"),
]


@pytest.mark.parametrize("item,what,fn,exc,pattern", GP_CASES, ids=[f"{c[0]}-{c[1]}" for c in GP_CASES])
def test_jokergp_refuses_bad_input(gp, item, what, fn, exc, pattern):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _check(lambda: fn(gp), exc, pattern)


def test_jokergp_items_all_covered():
    items = {c[0] for c in GP_CASES}
    assert items >= {"shapes", "nan", "empty", "one_class", "continuous_labels", "strings", "width", "mismatch",
                     "nonpositive", "loss_params", "unknown", "kernel_object"}


def test_jokergp_n_smaller_than_a_block_matches_the_posterior_mean(gp):
    """n = 1 and 3 (one block): the posterior mean k(x, X) (K + s2 I)^-1 y in closed form."""
    for n in (1, 3):
        Xs, ys = X[:n], y0[:n]
        m = gp.make().fit(Xs, ys)
        with torch.no_grad():
            Kx = gp.k(X, Xs).to_dense()
            Kn = gp.k(Xs, Xs).to_dense()
        noise = float(gp.lik.noise.detach())
        ref = Kx @ torch.linalg.solve(Kn + noise * torch.eye(n, dtype=X.dtype), ys)
        torch.testing.assert_close(m.predict(X), ref, rtol=1e-6, atol=1e-8)
        p = gp.make(n_features=32, block_size=4096).fit(Xs, ys).predict(X)
        assert bool(torch.isfinite(p).all())


def test_jokergp_integer_float16_noncontiguous_inputs_are_converted(gp):
    ref = gp.fitted.predict(X)
    Xf = X.t().contiguous().t()
    torch.testing.assert_close(gp.make().fit(Xf, y0).predict(Xf), ref)
    torch.testing.assert_close(gp.make().fit(X.numpy(), y0.numpy()).predict(X.numpy()), ref)
    Xi = torch.round(4 * X).long()
    torch.testing.assert_close(gp.make().fit(Xi, y0).predict(Xi), gp.make().fit(Xi.double(), y0).predict(Xi.double()))
    Xh = X.half()
    torch.testing.assert_close(gp.make().fit(Xh, y0).predict(Xh),
                               gp.make().fit(Xh.double(), y0).predict(Xh.double()))
    # a 1-D train_x is one feature (GPyTorch's convention)
    torch.testing.assert_close(gp.make().fit(X[:, 0], y0).predict(X[:, 0]),
                               gp.make().fit(X[:, :1], y0).predict(X[:, :1]))


def test_jokergp_missing_gpytorch_raises_importerror_naming_it(gp, monkeypatch):
    jgp = gp.make()  # modules built while GPyTorch imports
    for name in [m for m in sys.modules if m == "gpytorch" or m.startswith("gpytorch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "gpytorch", None)
    msg = _check(lambda: jgp.fit(X, y0), ImportError, r"needs the optional package 'gpytorch'")
    assert "pip install gpytorch" in msg
    from joker_ext.adapters.gpytorch import translate_kernel

    _check(lambda: translate_kernel(gp.k), ImportError, r"'gpytorch'.*pip install")


# ============================================================================ the harness
def _spec(**kw):
    from joker_ext.comparisons.spec import ExperimentSpec

    kw.setdefault("dataset", "diabetes")
    return ExperimentSpec(**kw)


def _args(*flags):
    from joker_ext.comparisons.spec import spec_from_args

    return spec_from_args(["--dataset", "diabetes", *flags])


def _toml(tmp_path_factory_text):
    from joker_ext.comparisons.spec import load_toml

    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as fh:
        fh.write(tmp_path_factory_text)
    return load_toml(fh.name)


def _run_suite(*a, **kw):
    from joker_ext.comparisons.runner import run_suite

    return run_suite(*a, echo=None, **kw)


def _metrics(task, y, s):
    from joker_ext.comparisons.runner import compute_metrics

    return compute_metrics(task, y, s)


HARNESS_CASES = [
    # spec fields (Python API and from_dict, the path of TOML files and run processes)
    ("shapes", "options not a dict of dicts", lambda: _spec(options={"joker": 3}), TypeError, r"^options must be"),
    ("nan", "penalty NaN", lambda: _spec(penalty=float("nan")), ValueError, r"^penalty must be positive"),
    ("nan", "sigma inf", lambda: _spec(sigma=float("inf")), ValueError, r"^sigma must be positive"),
    ("nan", "scores NaN", lambda: _metrics("regression", np.zeros(3), np.array([0.0, np.nan, 1.0])), ValueError,
     r"^scores must be finite"),
    ("empty", "backends empty", lambda: _spec(backends=[]), ValueError, r"^backends must be a non-empty list"),
    ("empty", "dataset empty", lambda: _spec(dataset=" "), TypeError, r"^dataset must be a data set name"),
    ("empty", "M list empty", lambda: _toml('dataset = "diabetes"\nM = []\n'), ValueError, r"^M must be"),
    ("n_small", "n_train 1", lambda: _spec(n_train=1), ValueError, r"^n_train must be an integer >= 2"),
    ("n_small", "n_test 0", lambda: _spec(n_test=0), ValueError, r"^n_test must be a positive integer"),
    ("continuous_labels", "classification loss for regression", lambda: _spec(task="regression", loss="hinge"),
     ValueError, r"^loss must be a regression loss"),
    ("continuous_labels", "regression loss for binary", lambda: _spec(task="binary", loss="pinball"), ValueError,
     r"^loss must be a classification loss"),
    ("strings", "sigma word", lambda: _spec(sigma="wide"), ValueError, r"^sigma must be a positive number or"),
    ("strings", "M word", lambda: _spec(M="many"), TypeError, r"^M must be a positive integer"),
    ("strings", "penalty string", lambda: _spec(penalty="small"), TypeError, r"^penalty must be a positive number"),
    ("strings", "standardize_y string", lambda: _spec(standardize_y="yes"), TypeError, r"^standardize_y must be"),
    ("mismatch", "scores length", lambda: _metrics("regression", np.zeros(3), np.zeros(2)), ValueError,
     r"^scores must have 3 entries"),
    ("mismatch", "unknown spec key",
     lambda: __import__("joker_ext.comparisons.spec", fromlist=["x"]).ExperimentSpec.from_dict(
        {"dataset": "diabetes", "penalti": 1.0}), ValueError, r"^spec keys must be ExperimentSpec fields .* got unknown experiment keys \['penalti'\]"),
    ("nonpositive", "penalty 0", lambda: _spec(penalty=0.0), ValueError, r"^penalty must be positive"),
    ("nonpositive", "penalty -1", lambda: _spec(penalty=-1.0), ValueError, r"^penalty must be positive"),
    ("nonpositive", "sigma 0", lambda: _spec(sigma=0.0), ValueError, r"^sigma must be positive"),
    ("nonpositive", "sigma -1 string", lambda: _spec(sigma="-1"), ValueError, r"^sigma must be positive"),
    ("nonpositive", "M 0", lambda: _spec(M=0), ValueError, r"^M must be a positive integer"),
    ("nonpositive", "seconds 0", lambda: _spec(seconds=0), ValueError, r"^seconds must be positive"),
    ("nonpositive", "repeats 0", lambda: _spec(repeats=0), ValueError, r"^repeats must be a positive integer"),
    ("nonpositive", "seed -1", lambda: _spec(seed=-1), ValueError, r"^seed must be an integer >= 0"),
    ("nonpositive", "epochs -1", lambda: _spec(epochs=-1.0), ValueError, r"^epochs must be positive"),
    ("nonpositive", "nu 0.7 Matern", lambda: _spec(kernel="matern", nu=0.7), ValueError, r"^nu must be 0.5, 1.5"),
    ("loss_params", "quantile 1.5", lambda: _spec(quantile=1.5), ValueError, r"^quantile must be in \(0, 1\)"),
    ("loss_params", "quantile 0", lambda: _spec(quantile=0.0), ValueError, r"^quantile must be in \(0, 1\)"),
    ("loss_params", "epsilon -1", lambda: _spec(epsilon=-1.0), ValueError, r"^epsilon must be non-negative"),
    ("loss_params", "delta 0", lambda: _spec(delta=0.0), ValueError, r"^delta must be positive"),
    ("unknown", "loss", lambda: _spec(loss="cubic"), ValueError, r"^loss must be one of"),
    ("unknown", "kernel", lambda: _spec(kernel="rbf"), ValueError, r"^kernel must be one of"),
    ("unknown", "task", lambda: _spec(task="ranking"), ValueError, r"^task must be one of"),
    ("unknown", "dtype float16", lambda: _spec(dtype="float16"), ValueError, r"^dtype must be 'float32'"),
    ("unknown", "device", lambda: _spec(device="nodevice"), ValueError, r"^device must be a torch device"),
    ("unknown", "device type", lambda: _spec(device=0.5), TypeError, r"^device must be a torch device"),
    ("unknown", "dataset", lambda: _spec(dataset="no_such_set"), ValueError, r"^dataset must be one of"),
    ("unknown", "dataset type", lambda: _spec(dataset=3), TypeError, r"^dataset must be a data set name"),
    ("unknown", "backend", lambda: _spec(backends="joker,nonsense"), ValueError, r"^backends must be names from"),
    ("unknown", "options backend", lambda: _spec(options={"nonsense": {}}), ValueError, r"^options must be keys"),
    ("unknown", "backend_class",
     lambda: __import__("joker_ext.comparisons.runner", fromlist=["x"]).backend_class("nope"),
     ValueError, r"^backend must be one of"),
    ("unknown", "metrics task", lambda: _metrics("ranking", np.zeros(2), np.zeros(2)), ValueError,
     r"^task must be one of"),
    # command-line flags: argparse's own errors become ValueError naming the flag
    ("flags", "--penalty word", lambda: _args("--penalty", "small"), ValueError, r"^--penalty must be a float, got 'small'"),
    ("flags", "--penalty -1", lambda: _args("--penalty", "-1"), ValueError, r"^penalty must be positive"),
    ("flags", "--sigma 0", lambda: _args("--sigma", "0"), ValueError, r"^sigma must be positive"),
    ("flags", "--sigma word", lambda: _args("--sigma", "wide"), ValueError, r"^--sigma must be a positive number"),
    ("flags", "--M word", lambda: _args("--M", "many"), ValueError, r"^--M must be an integer"),
    ("flags", "--M 0", lambda: _args("--M", "0"), ValueError, r"^M must be a positive integer"),
    ("flags", "--n-train word", lambda: _args("--n-train", "lots"), ValueError, r"^--n-train must be an int, got 'lots'"),
    ("flags", "--n-train 1", lambda: _args("--n-train", "1"), ValueError, r"^n_train must be an integer >= 2"),
    ("flags", "--dtype float16", lambda: _args("--dtype", "float16"), ValueError, r"^--dtype must be one of 'float32', 'float64', got 'float16'"),
    ("flags", "--device", lambda: _args("--device", "tpu:9"), ValueError, r"^device must be"),
    ("flags", "--kernel", lambda: _args("--kernel", "rbf"), ValueError, r"^--kernel must be one of 'gaussian'.*, got 'rbf'"),
    ("flags", "--loss", lambda: _args("--loss", "cubic"), ValueError, r"^loss must be one of"),
    ("flags", "--backends", lambda: _args("--backends", "joker,nope"), ValueError, r"^backends must be names"),
    ("flags", "--dataset", lambda: _args("--dataset", "no_such_set"), ValueError, r"^dataset must be one of"),
    ("flags", "--quantile 2", lambda: _args("--quantile", "2"), ValueError, r"^quantile must be in \(0, 1\)"),
    ("flags", "--epsilon -1", lambda: _args("--epsilon", "-1"), ValueError, r"^epsilon must be non-negative"),
    ("flags", "--delta nan", lambda: _args("--delta", "nan"), ValueError, r"^delta must be positive"),
    ("flags", "--seconds inf", lambda: _args("--seconds", "inf"), ValueError, r"^seconds must be positive"),
    ("flags", "--threads -1", lambda: _args("--threads", "-1"), ValueError, r"^--threads must be an integer >= 0"),
    ("flags", "--option", lambda: _args("--option", "nodot=1"), ValueError, r"^--option must be BACKEND.KEY"),
    ("flags", "--isolation", lambda: _args("--isolation", "thread"), ValueError, r"^--isolation must be one of 'forkserver', 'spawn', got 'thread'"),
    ("flags", "unknown flag", lambda: _args("--penalties", "1"), ValueError, r"^command-line flags must be .* got unrecognized arguments: --penalties 1"),
    # TOML files
    ("toml", "penalty -1", lambda: _toml('dataset = "diabetes"\npenalty = -1.0\n'), ValueError, r"^penalty must be"),
    ("toml", "M float", lambda: _toml('dataset = "diabetes"\nM = 2.5\n'), ValueError, r"^M must be a positive"),
    ("toml", "unknown key", lambda: _toml('dataset = "diabetes"\nkernal = "gaussian"\n'), ValueError,
     r"^the experiment file's top-level keys must be .* got unknown top-level keys \['kernal'\]"),
    ("toml", "threads", lambda: _toml('dataset = "diabetes"\nthreads = -2\n'), ValueError, r"^threads must be"),
    ("toml", "isolation", lambda: _toml('dataset = "diabetes"\nisolation = "thread"\n'), ValueError,
     r"^isolation must be one of"),
    ("toml", "figures", lambda: _toml('dataset = "diabetes"\nfigures = "yes"\n'), TypeError, r"^figures must be"),
    ("toml", "experiment table", lambda: _toml('dataset = "diabetes"\nexperiment = 3\n'), TypeError,
     r"^experiment must be"),
    ("toml", "dtype", lambda: _toml('dataset = "diabetes"\ndtype = "half"\n'), ValueError, r"^dtype must be"),
    # the runner
    ("runner", "specs not a list", lambda: _run_suite(_spec(), "/tmp/never"), TypeError,
     r"^specs must be a sequence of ExperimentSpec"),
    ("runner", "specs element", lambda: _run_suite([{"dataset": "diabetes"}], "/tmp/never"), TypeError,
     r"^specs must be a sequence of ExperimentSpec"),
    ("runner", "isolation", lambda: _run_suite([_spec()], "/tmp/never", isolation="thread"), ValueError,
     r"^isolation must be one of"),
    ("runner", "threads", lambda: _run_suite([_spec()], "/tmp/never", threads=-1), ValueError, r"^threads must be"),
    ("runner", "startup_grace", lambda: _run_suite([_spec()], "/tmp/never", startup_grace=-1.0), ValueError,
     r"^startup_grace must be non-negative"),
]
if torch.cuda.is_available():  # pragma: no cover - CPU machine
    HARNESS_CASES = [c for c in HARNESS_CASES if c[1] != "--device"]


@pytest.mark.parametrize("item,what,fn,exc,pattern", HARNESS_CASES, ids=[f"{c[0]}-{c[1]}" for c in HARNESS_CASES])
def test_harness_refuses_bad_specs_flags_and_files(item, what, fn, exc, pattern):
    _check(fn, exc, pattern)


def test_harness_normalises_valid_values():
    """Valid spellings keep working: numbers from strings / TOML floats, torch dtypes, devices."""
    s = _spec(sigma="2.5", M=100.0, n_train=500.0, dtype=torch.float32, device="cpu")
    assert (s.sigma, s.M, s.n_train, s.dtype, s.device) == (2.5, 100, 500, "float32", "cpu")
    assert isinstance(s.M, int) and isinstance(s.n_train, int)
    specs, run = _args("--penalty", "1e-4", "--M", "10,exact", "--threads", "0")
    assert [x.M for x in specs] == [10, None] and run["threads"] == 0 and specs[0].penalty == 1e-4
    assert _spec(dataset="magic").dataset == "magic"  # a KEEL set name


def test_harness_main_reports_bad_flags_without_a_traceback(capsys):
    from joker_ext.comparisons.__main__ import main

    assert main(["--dataset", "diabetes", "--penalty", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: penalty must be positive") and "Traceback" not in err
    assert main(["--penalty", "x"]) == 2
    assert "error: --penalty must be a float, got 'x'" in capsys.readouterr().err


def test_harness_missing_falkon_or_gpytorch_is_a_skip_naming_the_package(monkeypatch):
    """In the harness a missing optional package is not an error of the comparison: the backend's run is
    recorded as skipped, with the package named."""
    from joker_ext.comparisons.backends.base import Problem, Skip
    from joker_ext.comparisons.runner import backend_class

    for pkg in ("falkon", "gpytorch"):
        monkeypatch.setitem(sys.modules, pkg, None)
        with pytest.raises(Skip, match=f"{pkg} is not installed"):
            backend_class(pkg)(_spec(task="regression", sigma=1.0), Problem("regression", 100, 10, 3)).check()


# ============================================================================ fuzzing
# Three kinds of draws: 'clean' (finite modest data, default parameters), 'extreme' (the same data with
# valid but extreme parameters: penalties 1e-300 to 1e300, bandwidths 1e-8 to 1e8, one feature or far more
# features than points, blocks of one row or larger than n, float32) and 'bad' (anything: NaN / inf /
# 1e300 cells, empty or 1-D / 3-D arrays, strings, objects, float16, wrong labels, invalid parameters).
# Clean and extreme draws must fit; every draw must end in a result with finite predictions or in a
# documented ValueError / TypeError.
TRIED = Counter()
_special = st.sampled_from([np.nan, np.inf, -np.inf, 0.0, 1e300, -1e300, 1e-300, 5e-324, 1e30])
_cells = st.one_of(st.floats(-1e6, 1e6, allow_nan=False), _special)
_MODES = st.sampled_from(["clean", "extreme", "bad", "bad"])


def _fuzz_settings(n):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def _arrays(draw, mode: str):
    """(X, kind): a feature matrix, finite and modest with n >= 4 unless ``mode == 'bad'``."""
    good = mode != "bad"
    n = draw(st.integers(4, 10) if good else st.integers(0, 10))
    d = draw(st.integers(1, 3) if good else st.integers(0, 3))
    kind = draw(st.sampled_from(["float64", "float32", "noncontig", "numpy"] if good else
                                ["float64", "float32", "int", "float16", "object", "str", "1d", "3d", "noncontig",
                                 "numpy", "list"]))
    values = st.floats(-5, 5, allow_nan=False) if good else _cells
    A = np.array(draw(st.lists(values, min_size=n * d, max_size=n * d)), dtype=np.float64).reshape(n, d)
    if kind == "int":
        return torch.from_numpy(np.nan_to_num(A, nan=0, posinf=1, neginf=-1).clip(-1e6, 1e6).astype(np.int64)), kind
    if kind == "float16":
        with np.errstate(over="ignore"):
            return torch.from_numpy(A.astype(np.float16)), kind
    if kind == "object":
        return A.astype(object), kind
    if kind == "str":
        return A.astype(str), kind
    if kind == "1d":
        return torch.from_numpy(A.reshape(-1)), kind
    if kind == "3d":
        return torch.from_numpy(A.reshape(n, d, 1)), kind
    if kind == "noncontig":
        return torch.from_numpy(np.asfortranarray(A)), kind
    if kind == "numpy":
        return A, kind
    if kind == "list":
        return A.tolist(), kind
    return torch.from_numpy(A).to(torch.float32 if kind == "float32" else torch.float64), kind


def _targets(draw, m: int, kinds):
    y_kind = draw(st.sampled_from(kinds))
    rng = np.random.default_rng(draw(st.integers(0, 100)))
    pm = np.where(np.arange(m) % 2 == 0, 1.0, -1.0)
    rng.shuffle(pm)
    y = {
        "reg": rng.standard_normal(m),
        "pm1": pm,
        "01": (pm > 0).astype(np.float64),
        "one": np.ones(m),
        "short": rng.standard_normal(max(0, m - 1)),
        "nan": np.full(m, np.nan),
        "strings": np.array(["a", "b"])[rng.integers(0, 2, m)],
        "huge": np.full(m, 1e300),
        "2d": rng.standard_normal((m, 2)),
    }[y_kind]
    return (torch.from_numpy(y) if y.dtype.kind == "f" else y), y_kind


_BAD_Y = ["reg", "pm1", "01", "one", "short", "nan", "strings", "huge", "2d"]


def _rows(X):
    try:
        return len(X)
    except TypeError:
        return 0


def _as_float_tensor(X):
    """A fitted model's training input as a float tensor for predict."""
    T = torch.as_tensor(np.asarray(X, dtype=np.float64)) if not torch.is_tensor(X) else X
    return T if T.dtype in (torch.float32, torch.float64) else T.to(torch.float64)


def _predict(est, Xp, name, mode):
    """Predictions, or None when predict refuses them with its documented ValueError (an overflowing model
    or predictions beyond the input's dtype: never returned as infinity or NaN)."""
    try:
        return est.predict(Xp)
    except ValueError as exc:
        assert _FORM.search(str(exc)) and ("finite predictions" in str(exc) or "for these predictions" in str(exc)), exc
        TRIED[(name, mode, "predict refused")] += 1
        return None


@st.composite
def falkon_cases(draw):
    mode = draw(_MODES)
    X, kind = draw(_arrays(mode))
    logistic = draw(st.booleans())
    good_y = ["pm1"] if logistic else ["reg", "pm1", "01"]
    y, y_kind = _targets(draw, _rows(X), good_y if mode != "bad" else _BAD_Y)
    if mode == "clean":
        params = {}
    elif mode == "extreme":
        params = draw(st.fixed_dictionaries({}, optional={
            "penalty": st.sampled_from([1e-140, 1e-12, 1e12, 1e300]),
            "M": st.sampled_from([1, 2, 1000]),
            "sigma": st.sampled_from([1e-8, 1e-3, 1e3, 1e8]),
            "features": st.sampled_from(["cossin", "cos", "orf", "nystrom", "exact"]),
            "dtype": st.sampled_from(["float32", "float64"]),
            "block_size": st.sampled_from([1, 2, 5000]),
            "maxiter": st.sampled_from([1, 5]),
            "loss": st.sampled_from(["hinge", "squared_hinge", "logistic"] if y_kind == "pm1" else
                                    ["squared", "huber", "pinball", "epsilon_insensitive", "absolute"]),
            "quantile": st.sampled_from([1e-9, 0.5, 1 - 1e-9]),
            "epsilon": st.sampled_from([0.0, 1e6]),
            "delta": st.sampled_from([1e-12, 1e12]),
        }))
        if params.get("dtype") == "float32" and "penalty" in params:  # the range of C is narrower in float32
            params["penalty"] = min(max(params["penalty"], 1e-12), 1e12)
    else:
        params = draw(st.fixed_dictionaries({}, optional={
            "penalty": st.sampled_from([1e-3, 0.0, -1.0, 1e-300, 1e300, np.nan, "big"]),
            "M": st.sampled_from([4, 1, 0, 1000, None, 2.5]),
            "loss": st.sampled_from(["squared", "hinge", "logistic", "pinball", "huber", "bogus", None]),
            "quantile": st.sampled_from([0.5, 0.0, 1.5]),
            "epsilon": st.sampled_from([0.1, -1.0]),
            "delta": st.sampled_from([1.0, -1.0]),
            "sigma": st.sampled_from([1.0, 1e-8, 1e8, "rbf"]),
            "features": st.sampled_from(["auto", "cossin", "orf", "nystrom", "exact", "fourier"]),
            "dtype": st.sampled_from([None, "float32", "float16"]),
            "device": st.sampled_from(["cpu", "nodevice"]),
            "block_size": st.sampled_from([None, 1, 0, 5000]),
            "maxiter": st.sampled_from([1, 0]),
        }))
    return X, y, params, mode, logistic


@_fuzz_settings(800)
@given(case=falkon_cases())
def test_fuzz_falkon_faces(case):
    X, y, params, mode, logistic = case
    params = dict(params)
    sigma = params.pop("sigma", 1.0)
    kernel = sigma if isinstance(sigma, str) else GaussianKernel(sigma)
    penalty = params.pop("penalty", 1e-3)
    M = params.pop("M", 4)
    loss = params.pop("loss", "logistic" if logistic else "squared")
    maxiter = params.pop("maxiter", 2)
    if logistic:
        for k in ("quantile", "epsilon", "delta"):
            params.pop(k, None)
        if mode == "extreme" and loss not in ("hinge", "squared_hinge", "logistic"):
            loss = "logistic"
        est = JokerLogisticFalkon(kernel, [max(penalty, 1e-300) * 10, penalty], [maxiter, maxiter], loss, M, seed=0,
                                  **params) if mode != "bad" else \
            JokerLogisticFalkon(kernel, [penalty, penalty], [maxiter, maxiter], loss, M, seed=0, **params)
    else:
        est = JokerFalkon(kernel, penalty, M, maxiter=maxiter, seed=0, loss=loss, **params)
    name = type(est).__name__
    TRIED[(name, mode)] += 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(X, y)
    except (ValueError, TypeError) as exc:
        TRIED[(name, mode, "refused")] += 1
        assert _FORM.search(str(exc)), f"message not of the form '<argument> must be ..., got ...': {exc}"
        assert mode == "bad", f"valid input refused: {exc}"
        return
    TRIED[(name, mode, "fitted")] += 1
    Xp = _as_float_tensor(X)
    out = _predict(est, Xp, name, mode)
    assert out is None or bool(torch.isfinite(out).all()), f"NaN or infinity in a prediction ({mode}, {params})"
    with pytest.raises(ValueError, match="features"):
        est.predict(torch.zeros(2, Xp.shape[1] + 1, dtype=Xp.dtype))


@st.composite
def gp_cases(draw):
    mode = draw(_MODES)
    X, kind = draw(_arrays(mode))
    if mode == "bad":
        y, y_kind = _targets(draw, _rows(X), _BAD_Y)
    else:
        y, y_kind = _targets(draw, _rows(X), ["reg", "01", "pm1"])
    if mode == "clean":
        params = {"likelihood": "bernoulli" if y_kind != "reg" else "gaussian"}
    elif mode == "extreme":
        classification = y_kind != "reg"
        params = draw(st.fixed_dictionaries({
            "likelihood": st.just("bernoulli" if classification else "gaussian")}, optional={
            "lengthscale": st.sampled_from([1e-6, 1e-3, 1e3, 1e6]),
            "covar": st.sampled_from(["rbf", "matern", "scale_rbf"]),
            "noise": st.sampled_from([1e-4, 1e4]),
            "loss": st.sampled_from(["hinge", "logistic", "squared_hinge"] if classification else
                                    ["huber", "pinball", "epsilon_insensitive", "absolute"]),
            "C": st.sampled_from([1e-300, 1e-12, 1e12, 1e140]),
            "n_features": st.sampled_from([1, 2, 1000]),
            "quantile": st.sampled_from([1e-9, 1 - 1e-9]),
            "delta": st.sampled_from([1e-12, 1e12]),
            "dtype": st.sampled_from([torch.float64, "float32"]),
            "block_size": st.sampled_from([1, 5000]),
        }))
        if params.get("dtype") == "float32" and "C" in params:  # the range of C is narrower in float32
            params["C"] = min(max(params["C"], 1e-30), 1e12)
    else:
        params = draw(st.fixed_dictionaries({}, optional={
            "lengthscale": st.sampled_from([1.0, 1e-6, 1e6]),
            "covar": st.sampled_from(["rbf", "matern", "scale_rbf", "linear", "joker", "string"]),
            "likelihood": st.sampled_from(["gaussian", "bernoulli", "student"]),
            "loss": st.sampled_from([None, "huber", "pinball", "hinge", "logistic", "bogus"]),
            "C": st.sampled_from([None, 1.0, 0.0, -1.0, 1e-300, 1e300, np.nan]),
            "n_features": st.sampled_from([None, 8, 0]),
            "quantile": st.sampled_from([0.5, 1.5]),
            "delta": st.sampled_from([1.0, 0.0]),
            "dtype": st.sampled_from([torch.float64, "float32", torch.float16]),
            "device": st.sampled_from([None, "cpu", "nodevice"]),
            "block_size": st.sampled_from([None, 1, 0, 5000]),
        }))
    return X, y, params, mode


@_fuzz_settings(600)
@given(case=gp_cases())
def test_fuzz_jokergp(gp, case):
    X, y, params, mode = case
    params = dict(params)
    gk, gl = gp.gpytorch.kernels, gp.gpytorch.likelihoods
    covar = params.pop("covar", "rbf")
    ls = params.pop("lengthscale", 1.0)
    if covar in ("rbf", "matern", "scale_rbf"):
        base = gk.MaternKernel(nu=1.5) if covar == "matern" else gk.RBFKernel()
        base.lengthscale = ls
        covar = gk.ScaleKernel(base) if covar == "scale_rbf" else base
    else:
        covar = {"linear": gk.LinearKernel(), "joker": K, "string": "rbf"}[covar]
    lik = {"gaussian": gl.GaussianLikelihood(), "bernoulli": gl.BernoulliLikelihood(),
           "student": gl.StudentTLikelihood()}[params.pop("likelihood", "gaussian")]
    noise = params.pop("noise", None)
    if noise is not None:
        lik.noise = noise
    est = gp.JokerGP(covar, lik, max_iter=40, **params)
    TRIED[("JokerGP", mode)] += 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(X, y)
    except (ValueError, TypeError) as exc:
        TRIED[("JokerGP", mode, "refused")] += 1
        assert _FORM.search(str(exc)), f"message not of the form '<argument> must be ..., got ...': {exc}"
        assert mode == "bad", f"valid input refused: {exc}"
        return
    TRIED[("JokerGP", mode, "fitted")] += 1
    Xp = _as_float_tensor(X)
    out = _predict(est, Xp, "JokerGP", mode)
    assert out is None or bool(torch.isfinite(out).all()), f"NaN or infinity in a prediction ({mode}, {params})"
    width = Xp.shape[1] if Xp.dim() == 2 else 1
    with pytest.raises(ValueError, match="features"):
        est.predict(torch.zeros(2, width + 1, dtype=torch.float64))


def teardown_module(module):
    counts = {" ".join(k): v for k, v in sorted(TRIED.items())}
    print("\nfuzz counts:", counts)
