"""Every engine on a CUDA device gives the CPU's fit (skipped without a GPU).

The engines' CUDA paths differ from the CPU's: float32 feature passes accumulated in float64, pinned-memory
convergence flags, resident or streamed inputs, the band Hessian's row selection, cuSOLVER factorisations. The
reference is the same problem solved on the CPU (whose optimum the cvxpy tests of ``test_engines.py`` check);
each CUDA fit must also certify its own duality gap. A CUDA fit whose objective or predictions differ from the
CPU's, or which does not converge, fails.
"""
import numpy as np
import pytest
import torch

from joker_ext import JokerClassifier, JokerRegressor

from conftest import PARAMS, make_binary, make_regression

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

REGRESSION = ["squared", "huber", "epsilon_insensitive", "absolute", "pinball"]
CLASSIFICATION = ["hinge", "squared_hinge", "logistic"]
TOL = 1e-10


def _pair(loss, n, d, **params):
    """The CPU fit and the CUDA fit of the same problem."""
    classify = loss in CLASSIFICATION
    X, y = (make_binary if classify else make_regression)(n=n, d=d, seed=3)
    est = JokerClassifier if classify else JokerRegressor
    extra = {} if classify else PARAMS
    params.setdefault("tol", TOL)
    fits = [est(loss=loss, C=10.0, sigma=1.0, random_state=0, device=device, **extra, **params).fit(X, y)
            for device in ("cpu", "cuda")]
    return X, fits


def _check(X, cpu, gpu, rtol=1e-8):
    assert gpu.status_ == "converged", (gpu.status_, gpu.relative_gap_)
    assert gpu.relative_gap_ <= rtol
    assert abs(gpu.primal_objective_ - cpu.primal_objective_) <= rtol * abs(cpu.primal_objective_)
    f_cpu = cpu.decision_function(X) if hasattr(cpu, "decision_function") else cpu.predict(X)
    f_gpu = gpu.decision_function(X) if hasattr(gpu, "decision_function") else gpu.predict(X)
    np.testing.assert_allclose(f_gpu, f_cpu, rtol=0, atol=1e-4 * np.abs(f_cpu).max())


@pytest.mark.parametrize("loss", REGRESSION + CLASSIFICATION)
def test_exact_engines_on_cuda_match_the_cpu(loss):
    X, (cpu, gpu) = _pair(loss, 1500, 4, )
    _check(X, cpu, gpu)


@pytest.mark.parametrize("loss", ["hinge", "epsilon_insensitive", "logistic"])
def test_exact_engines_with_intercept_on_cuda_match_the_cpu(loss):
    """Hinge, epsilon-insensitive: the active-set method's equality row; logistic: the intercept inside the Newton
    steps, whose systems (n >= dense.MIXED_PRECISION_MIN) are factored in float32 and solved by conjugate gradients
    in float64 through that factor."""
    X, (cpu, gpu) = _pair(loss, 1500, 4, fit_intercept=True)
    _check(X, cpu, gpu)
    assert np.abs(np.asarray(gpu.intercept_) - cpu.intercept_).max() <= 1e-6


@pytest.mark.parametrize("loss", REGRESSION + CLASSIFICATION)
def test_feature_newton_on_cuda_matches_the_cpu(loss):
    """M = 300: the formed Hessian, and for the kinked losses the smoothing continuation's finishing step."""
    X, (cpu, gpu) = _pair(loss, 3000, 5, n_features=300)
    _check(X, cpu, gpu)


@pytest.mark.parametrize("loss", ["hinge", "epsilon_insensitive"])
def test_feature_newton_band_hessian_on_cuda_matches_the_cpu(loss):
    """M = 1100 > EXACT_HESSIAN_MAX_FEATURES: the Hessian of the band's rows."""
    X, (cpu, gpu) = _pair(loss, 4000, 5, n_features=1100)
    _check(X, cpu, gpu)


@pytest.mark.parametrize("loss", ["pinball", "hinge", "logistic"])
def test_feature_newton_intercept_on_cuda_matches_the_cpu(loss):
    """Pinball, hinge: the intercept search around the engine; logistic: ``b`` inside the Newton steps (the
    bordered system's two right-hand sides in one conjugate-gradient run, float32 passes on the GPU)."""
    X, (cpu, gpu) = _pair(loss, 3000, 5, n_features=256, fit_intercept=True)
    _check(X, cpu, gpu)
    assert np.abs(np.asarray(gpu.intercept_) - cpu.intercept_).max() <= 1e-6


def test_dbcd_tr_on_cuda_matches_the_cpu():
    X, (cpu, gpu) = _pair("huber", 800, 4, n_features=128, solver="dbcd_tr", tol=1e-6)
    _check(X, cpu, gpu, rtol=1e-5)


def test_nystrom_logistic_at_a_tiny_penalty_on_cuda_matches_the_cpu():
    """JokerFalkon, logistic loss at penalty 1e-8 on Nystrom features: Falkon's preconditioner makes the conjugate
    gradients crawl, and the engine forms the Hessian from the kept features for the rest of the fit, on the GPU as
    on the CPU."""
    from sklearn.datasets import make_classification

    from joker_ext import JokerFalkon
    from joker_ext.kernels import GaussianKernel

    X, y = make_classification(n_samples=1000, n_features=8, random_state=0)
    X = torch.as_tensor((X - X.mean(0)) / X.std(0))
    Y = torch.as_tensor(np.where(y > 0, 1.0, -1.0)).reshape(-1, 1)
    cpu, gpu = (JokerFalkon(GaussianKernel(3.0), 1e-8, 200, seed=0, loss="logistic", device=device).fit(X, Y)
                for device in ("cpu", "cuda"))
    for m in (cpu, gpu):
        assert m.status_ == "converged" and m.n_iter_ <= 20, (m.status_, m.n_iter_, m.relative_gap_)
    assert abs(gpu.result_.primal - cpu.result_.primal) <= 1e-8 * abs(cpu.result_.primal)
    f_cpu, f_gpu = cpu.predict(X), gpu.predict(X).cpu()
    np.testing.assert_allclose(f_gpu, f_cpu, rtol=0, atol=1e-4 * float(f_cpu.abs().max()))


def test_one_vs_one_on_cuda_is_the_cpus_model():
    """``multi_class='ovo'`` on a GPU fits each pair there (the compiled batch is the CPU's): the CPU's model; and
    'auto' on a GPU is one-vs-rest (a column per class)."""
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=240, n_features=5, n_informative=4, n_redundant=0, n_classes=4,
                               n_clusters_per_class=1, random_state=0)
    params = dict(C=2.0, gamma=0.3, fit_intercept=True)
    cpu = JokerClassifier(**params, multi_class="ovo").fit(X, y)
    gpu = JokerClassifier(**params, multi_class="ovo", device="cuda").fit(X, y)
    np.testing.assert_allclose(gpu.decision_function(X), cpu.decision_function(X), atol=1e-7)
    assert JokerClassifier(**params, device="cuda").fit(X, y).dual_coef_.shape[1] == 4


def test_float32_free_factors_on_cuda_give_the_cpu_fit(monkeypatch):
    """The working-set engine on CUDA with its free blocks factored in float32 (the thresholds lowered to this size)
    and every solve through them finished by float64 conjugate gradients on the device: the hinge fit certifies and
    equals the CPU's float64 fit."""
    import joker_ext.free_factor as ff

    X, y = make_binary(n=600, d=5, seed=3)
    params = dict(loss="hinge", C=10.0, sigma=1.0, tol=TOL)
    cpu = JokerClassifier(**params).fit(X, y)
    monkeypatch.setattr(ff, "FLOAT32_FREE_MIN", 32)
    monkeypatch.setattr(ff, "FLOAT32_WORTH", 0)
    devices, original = [], ff.FreeFactor._finished
    monkeypatch.setattr(ff.FreeFactor, "_finished",
                        lambda self, K, *rest: devices.append(K.device.type) or original(self, K, *rest))
    gpu = JokerClassifier(**params, device="cuda").fit(X, y)
    assert "cuda" in devices
    _check(X, cpu, gpu)


def test_cholesky_pcg_on_cuda_reaches_float64_accuracy_without_waiting():
    """:func:`joker_ext.dense.cholesky_pcg` on CUDA tensors (where it runs all ``max_iter`` iterations, a finished
    column's steps zero): float64's accuracy from a float32 factor, as numpy's float64 solve, a zero column zero."""
    from joker_ext.dense import cholesky_ex, cholesky_pcg

    g = torch.Generator().manual_seed(1)
    Q, _ = torch.linalg.qr(torch.randn(300, 300, generator=g, dtype=torch.float64))
    H = (Q * torch.logspace(0, 4, 300, dtype=torch.float64)) @ Q.T
    R = torch.randn(300, 3, generator=g, dtype=torch.float64)
    R[:, 2] = 0.0
    Hc, Rc = H.cuda(), R.cuda()
    L, info = cholesky_ex(Hc.to(torch.float32))
    assert int(info) == 0
    X, residual = cholesky_pcg(L, lambda X: Hc @ X, Rc, tol=1e-15, max_iter=12)
    reference = np.linalg.solve(H.numpy(), R.numpy())
    assert X.device.type == "cuda" and residual <= 1e-14
    np.testing.assert_allclose(X.cpu().numpy(), reference, rtol=0, atol=1e-9 * np.abs(reference).max())
    assert not X[:, 2].any()
