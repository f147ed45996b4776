"""The updated Cholesky factor of the active-set engines' free block (joker_ext.free_factor), against numpy's
dense solve of the same systems and, through a Huber fit, against LIBSVM."""
import numpy as np
import pytest
import torch
from sklearn.datasets import make_regression
from sklearn.metrics.pairwise import rbf_kernel
from sklearn.svm import SVR

import joker_ext.free_factor as ff
from joker_ext import JokerRegressor
from joker_ext.dense import cholesky_shifted


def _kernel(n, gamma=0.5, seed=0):
    X = np.random.default_rng(seed).normal(size=(n, 3))
    return torch.tensor(rbf_kernel(X, gamma=gamma))


def _check(K, d, free, V, X, tol):
    """``X`` solves ``(K_FF + diag(d_F)) X = V`` to ``tol`` relative (numpy's dense solve as the reference)."""
    idx = free.numpy()
    H = K.numpy()[np.ix_(idx, idx)] + np.diag(d.numpy()[idx])
    ref = np.linalg.solve(H, V.numpy())
    assert np.abs(X.numpy() - ref).max() <= tol * np.abs(ref).max()


def _outcomes(monkeypatch, method: str) -> list:
    """Record, for each call of ``FreeFactor.<method>``, whether it gave a solve (not None)."""
    calls, original = [], getattr(ff.FreeFactor, method)

    def recording(self, *args):
        out = original(self, *args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(ff.FreeFactor, method, recording)
    return calls


@pytest.mark.parametrize("d_scale", [1e-1, 1e-6])
def test_updates_solve_the_same_systems(monkeypatch, d_scale):
    """A walk of free sets (additions, removals, both) solved through the updated factor equals the dense
    solve of each system, and the updates were used (not only fresh factorisations)."""
    monkeypatch.setattr(ff, "MIN_UPDATE_SIZE", 0)
    n = 400
    K = _kernel(n)
    gen = torch.Generator().manual_seed(1)
    d = d_scale * (1.0 + torch.rand(n, generator=gen, dtype=torch.float64))
    free = torch.sort(torch.randperm(n, generator=gen)[:300]).values
    factor = ff.FreeFactor(cholesky_shifted)
    for step in range(12):
        V = torch.randn(free.numel(), 2, generator=gen, dtype=torch.float64)
        X = factor.solve(K, free, d, V)
        _check(K, d, free, V, X, 1e-8 if d_scale < 1e-3 else 1e-11)
        out = torch.ones(n, dtype=torch.bool)
        out[free] = False
        outside = torch.nonzero(out).reshape(-1)
        add = outside[torch.randperm(outside.numel(), generator=gen)[: step % 4 * 3]]
        drop = free[torch.randperm(free.numel(), generator=gen)[: (step + 1) % 3 * 4]]
        keep = free[~torch.isin(free, drop)]
        free = torch.sort(torch.cat([keep, add])).values
    assert factor.updates >= 6 and factor.fresh <= 6


def test_relabelled_factor_solves_the_next_matrix(monkeypatch):
    """A factor carried to another matrix that holds the same entries at other indices (the working set's next
    subproblem: other points join, the order changes) solves that matrix's systems through updates (no fresh
    factorisation) to the dense solve's accuracy, with pins kept across the relabelling; a wrong number of indices
    is refused."""
    monkeypatch.setattr(ff, "MIN_UPDATE_SIZE", 0)
    n = 500
    K = _kernel(n, gamma=0.2)
    gen = torch.Generator().manual_seed(3)
    d = 1e-6 * torch.ones(n, dtype=torch.float64)
    first = torch.arange(0, 300)  # the first subproblem's points (global indices)
    factor = ff.FreeFactor(cholesky_shifted)
    free = torch.arange(0, 260)
    V = torch.randn(free.numel(), 2, generator=gen, dtype=torch.float64)
    factor.solve(K[first][:, first], free, d[first], V)
    pinned = torch.arange(5, 260)  # a few coordinates leave the free set: pinned
    factor.solve(K[first][:, first], pinned, d[first], V[5:])
    held = first[factor.held()]
    # the next subproblem: the held points and 150 others, numbered in another order
    others = torch.arange(300, 500)[torch.randperm(200, generator=gen)[:150]]
    nxt = torch.cat([others, held])[torch.randperm(150 + held.numel(), generator=gen)]
    K2, d2 = K[nxt][:, nxt], d[nxt]
    position = torch.argsort(nxt)[torch.searchsorted(torch.sort(nxt).values, held)]
    factor.relabel(position)
    fresh = factor.fresh
    for grow in (0, 6, 12):  # the same free set, then a few new points join
        free2 = torch.sort(torch.cat([position[5:], torch.nonzero(torch.isin(nxt, others[:grow])).reshape(-1)])).values
        V2 = torch.randn(free2.numel(), 2, generator=gen, dtype=torch.float64)
        _check(K2, d2, free2, V2, factor.solve(K2, free2, d2, V2), 1e-8)
    assert factor.fresh == fresh
    with pytest.raises(ValueError, match="relabel: expected"):
        factor.relabel(position[:-1])


def test_residual_scale_follows_the_matrix_it_is_asked_about():
    """A factor that serves one matrix and then a smaller one (the working set's next subproblem, when no factor
    carried over) bounds ``|H_FF|_inf`` of the matrix it is given: ``max_i (|K_i:|_1 + |d_i|)`` over the free rows,
    computed here with numpy (it once kept the first matrix's row norms and indexed past their end)."""
    factor = ff.FreeFactor(cholesky_shifted)
    for n in (40, 25, 25):
        K = _kernel(n, seed=n)
        d = torch.full((n,), 1e-3, dtype=torch.float64)
        free = torch.arange(0, n, 2)
        ref = (np.abs(K.numpy()).sum(1) + 1e-3)[free.numpy()].max()
        assert factor.residual_scale(K, free, d) == pytest.approx(ref, rel=1e-12)
        factor.solve(K, free, d, torch.ones(free.numel(), 1, dtype=torch.float64))


def test_pinned_columns_kept_across_solves_stay_exact(monkeypatch):
    """Pinned coordinates that change from solve to solve (a window sliding over the factor's coordinates, freed
    again as it moves on, so that kept columns ``H_UU^{-1} e_j`` serve later solves) give the dense solve's answer at
    every step, through updates of the one factor, and the kept columns never outnumber the factor's coordinates."""
    monkeypatch.setattr(ff, "MIN_UPDATE_SIZE", 0)
    K = _kernel(300, gamma=0.3, seed=2)
    d = 1e-3 * torch.ones(300, dtype=torch.float64)
    gen = torch.Generator().manual_seed(5)
    factor = ff.FreeFactor(cholesky_shifted)
    for step in range(14):
        pinned = torch.arange(30 * step, 30 * step + 30) % 300 if step else torch.tensor([], dtype=torch.long)
        free = torch.tensor([i for i in range(300) if i not in set(pinned.tolist())])
        V = torch.randn(free.numel(), 2, generator=gen, dtype=torch.float64)
        _check(K, d, free, V, factor.solve(K, free, d, V), 1e-9)
        assert factor._pin_W is None or factor._pin_W.shape[1] <= factor.U.numel()
    assert factor.fresh == 1 and factor.updates == 13


def test_new_diagonal_factors_afresh(monkeypatch):
    """A different diagonal is a different matrix: the factor is not reused for it."""
    monkeypatch.setattr(ff, "MIN_UPDATE_SIZE", 0)
    K = _kernel(200)
    free = torch.arange(0, 200, 2)
    factor = ff.FreeFactor(cholesky_shifted)
    V = torch.ones(free.numel(), 1, dtype=torch.float64)
    for scale in (1e-2, 1e-3):
        d = torch.full((200,), scale, dtype=torch.float64)
        _check(K, d, free, V, factor.solve(K, free, d, V), 1e-10)
    assert factor.fresh == 2 and factor.updates == 0


def test_huber_fit_through_updates_matches_libsvm(monkeypatch):
    """Huber regression with an intercept, exact kernel: the active-set engine's steps go through the updated
    factor (counted) and the primal objective equals LIBSVM's optimum of the same problem (the Huber dual is
    SVR's with epsilon = 0 and box C delta on K + I / C)."""
    monkeypatch.setattr(ff, "MIN_UPDATE_SIZE", 64)
    calls = _outcomes(monkeypatch, "_updated_solve")
    X, y = make_regression(n_samples=600, n_features=5, noise=10.0, random_state=0)
    X = (X - X.mean(0)) / X.std(0)
    y = (y - y.mean()) / y.std()
    C, gamma, delta = 1.0, 0.1, 0.5
    est = JokerRegressor(loss="huber", delta=delta, C=C, gamma=gamma, fit_intercept=True,
                         solver="active_set").fit(X, y)
    assert any(calls)
    K = rbf_kernel(X, gamma=gamma)
    ref = SVR(kernel="precomputed", C=C * delta, epsilon=0.0, tol=1e-10).fit(K + np.eye(len(y)) / C, y)
    a = np.zeros(len(y))
    a[ref.support_] = ref.dual_coef_.ravel()
    f = K @ a + ref.intercept_[0]
    r = np.abs(y - f)
    primal = 0.5 * a @ (K @ a) + C * np.where(r <= delta, 0.5 * r ** 2, delta * (r - 0.5 * delta)).sum()
    assert est.relative_gap_ <= 1e-10
    assert abs(est.primal_objective_ - primal) <= 1e-9 * primal



@pytest.mark.parametrize("fallback", [False, True])
def test_polish_refines_an_inexact_step_to_the_dense_solves_accuracy(monkeypatch, fallback):
    """``_Column._polish`` takes a settled step whose free coordinates (and intercept) are off by 1e-6 relative (an
    unrefined solve through a pinned factor) to a KKT residual of the free rows
    (``(K a)_F + (h + s)_F a_F + b - r_F + kink sign_F``, ``K a`` formed here) as small as numpy's dense solve of the
    same bordered system leaves, with ``f = K a`` and ``sum a`` kept; hinge dual with intercept, 200+ free
    coordinates, proximal weight 1e-4 (condition number of ``H_FF`` about 1e4). With a residual test that never
    passes (``fallback``) it ends in a fresh factorisation, to the same accuracy."""
    import joker_ext.active_set as act
    from joker_ext.active_set import _Column
    from joker_ext.box_sets import FREE
    from joker_ext.losses import get_loss

    n = 400
    X = np.random.default_rng(4).normal(size=(n, 3))
    K = torch.tensor(rbf_kernel(X, gamma=0.3))
    y = torch.tensor(np.where(X[:, 0] + 0.5 * np.random.default_rng(5).normal(size=n) > 0, 1.0, -1.0))
    C = 1.0
    c = torch.full((n,), C, dtype=torch.float64)
    col = _Column(K, K.diagonal().clone(), get_loss("hinge"), y, c, True)
    zero = torch.zeros(n, dtype=torch.float64)
    abar, _, _, _, (code, sgn, value) = col.round(zero, zero.clone(), 0.0, zero.clone(), col.scale / c)
    free = (code == FREE).numpy()
    assert free.sum() > 200
    s = 1e-4 * col.scale / c
    Kn, d, m = K.numpy(), (col.h + s).numpy(), int(free.sum())
    target = ((col.lin + s * abar).numpy() - col.kink * sgn.numpy())[free]
    # numpy's dense solve of the bordered system of these sets
    ref = value.numpy().copy()
    ref[free] = 0.0
    H = Kn[np.ix_(free, free)] + np.diag(d[free])
    bordered = np.block([[H, np.ones((m, 1))], [np.ones((1, m)), np.zeros((1, 1))]])
    sol = np.linalg.solve(bordered, np.concatenate([target - Kn[free] @ ref, [col.total - ref.sum()]]))
    ref[free], b_ref = sol[:m], sol[m]

    def residual(aa, bb):
        r = (Kn @ aa)[free] + d[free] * aa[free] + bb - target
        return np.abs(r).max() / (np.abs(target).max() + np.abs(Kn[free]).sum(1).max() * np.abs(aa).max())

    noise = np.random.default_rng(6).normal(size=m)
    a0 = torch.tensor(ref)
    a0[torch.tensor(free)] += torch.tensor(1e-6 * np.abs(ref).max() * (noise - noise.mean()))
    b0 = b_ref * (1 + 1e-6)
    col.factor.solve(K, torch.nonzero(code == FREE).reshape(-1), col.h + s,
                     torch.ones(m, 1, dtype=torch.float64))  # the factor of the step's free block
    assert residual(a0.numpy(), b0) > 1e-9
    monkeypatch.setattr(ff, "MIN_UPDATE_SIZE", 0)  # the corrections go through the factor just formed
    if fallback:
        monkeypatch.setattr(act, "RESIDUAL_TOL", 0.0)
    fresh = col.factor.fresh
    a1, f1, b1 = col._polish(a0, K @ a0, b0, code, sgn, value, s, abar)
    assert col.factor.fresh == fresh + fallback
    an = a1.numpy()
    assert residual(an, b1) <= 10 * max(residual(ref, b_ref), 1e-16)
    assert abs(an.sum() - col.total) <= 1e-12 * np.abs(an).sum()
    assert np.abs(f1.numpy() - Kn @ an).max() <= 1e-13 * (np.abs(Kn) @ np.abs(an)).max()  # its rounding
    assert np.array_equal(an[~free], value.numpy()[~free])  # the fixed coordinates stay where the sets put them


def _mixed_calls(monkeypatch) -> list:
    """Record whether each float32-factor solve of :class:`FreeFactor` was accepted, and allow them at small orders."""
    monkeypatch.setattr(ff, "MIXED_PRECISION_MIN", 1)
    calls, refined = [], ff.FreeFactor._refined

    def recording(*args):
        out = refined(*args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(ff.FreeFactor, "_refined", staticmethod(recording))
    return calls


@pytest.mark.parametrize("d_scale", [1.0, 1e-3])
def test_mixed_fresh_solve_has_a_float64_solves_accuracy(monkeypatch, d_scale):
    """A well-conditioned fresh block (``cond <= |H|_inf / min d``, times float32's epsilon, at most the contraction
    bound) is solved through a float32 factor refined in float64 to numpy's float64 solve, at a backward error of
    float64's order; the factor is not kept (no update goes through a float32 factor)."""
    calls = _mixed_calls(monkeypatch)
    n = 600
    K = _kernel(n, gamma=0.1)
    gen = torch.Generator().manual_seed(4)
    d = d_scale * (1.0 + torch.rand(n, generator=gen, dtype=torch.float64))
    free = torch.arange(n)
    V = torch.randn(n, 2, generator=gen, dtype=torch.float64)
    factor = ff.FreeFactor(cholesky_shifted, mixed=True)
    X = factor.solve(K, free, d, V)
    assert calls == [True] and factor.held() is None
    _check(K, d, free, V, X, 1e-12 if d_scale == 1.0 else 1e-10)
    H = K + torch.diag(d)
    backward = (V - H @ X).abs().max() / (V.abs().max() + H.abs().sum(1).max() * X.abs().max())
    assert backward <= 1e-14


def test_mixed_solve_declines_an_ill_conditioned_block_and_a_stalled_refinement(monkeypatch):
    """A block whose conditioning bound is too large for float32 is factored in float64 at once (no float32 solve);
    one whose refinements stop above the accepted backward error is solved again in float64. Both to numpy's
    solve."""
    calls = _mixed_calls(monkeypatch)
    n = 500
    K = _kernel(n, gamma=0.1)
    free = torch.arange(n)
    V = torch.randn(n, 1, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    d = torch.full((n,), 1e-6, dtype=torch.float64)  # |K|_inf / 1e-6 * 6e-8 >> 1
    X = ff.FreeFactor(cholesky_shifted, mixed=True).solve(K, free, d, V)
    assert calls == []
    _check(K, d, free, V, X, 1e-6)
    monkeypatch.setattr(ff, "MIXED_ACCEPTED", 0.0)  # no refinement reaches a zero residual
    d = torch.ones(n, dtype=torch.float64)
    factor = ff.FreeFactor(cholesky_shifted, mixed=True)
    X = factor.solve(K, free, d, V)
    assert calls == [False] and factor.held() is not None  # the float64 factor is kept
    _check(K, d, free, V, X, 1e-12)


def test_squared_loss_fit_through_the_mixed_factor_is_kernel_ridge(monkeypatch):
    """The exact squared loss (one active-set step on all of ``K + diag(1 / C)``) at n = 1200, above
    ``MIXED_PRECISION_MIN``: its block is factored once for all three target columns (in float32, each solve
    refined), and the model is scikit-learn's multi-output KernelRidge (``alpha = 1 / C``) to float64's accuracy; at
    a C whose bound rules float32 out, too."""
    from sklearn.kernel_ridge import KernelRidge

    factored, cholesky = [], ff.cholesky_ex
    monkeypatch.setattr(ff, "cholesky_ex", lambda H, **kw: factored.append(H.dtype) or cholesky(H, **kw))
    X, Y = make_regression(n_samples=1200, n_features=5, n_targets=3, noise=5.0, random_state=1)
    X, Y = (X - X.mean(0)) / X.std(0), (Y - Y.mean(0)) / Y.std(0)
    for C, mixed in [(10.0, True), (1e6, False)]:
        factored.clear()
        m = JokerRegressor(loss="squared", C=C, gamma=0.2, fit_intercept=False).fit(X, Y)
        krr = KernelRidge(alpha=1.0 / C, kernel="rbf", gamma=0.2).fit(X, Y)
        assert factored == [torch.float32 if mixed else torch.float64], C  # one factor for the three columns
        # the predictions, to float64's accuracy at the system's conditioning (cond ~ 100 C: a float64 factor per
        # column was 1.6e-9 off KernelRidge at C = 10^6, where the coefficients themselves are determined to 1e-5)
        np.testing.assert_allclose(m.predict(X), krr.predict(X), rtol=0, atol=1e-12 * C)


def _float32_everywhere(monkeypatch):
    """Every fresh factor of a float64 block made in float32 (thresholds off), updates from the smallest size."""
    monkeypatch.setattr(ff, "FLOAT32_FREE_MIN", 0)
    monkeypatch.setattr(ff, "FLOAT32_WORTH", 0)
    monkeypatch.setattr(ff, "MIN_UPDATE_SIZE", 0)


def test_float32_factor_updates_solve_the_same_systems_to_float64_accuracy(monkeypatch):
    """A walk of free sets (additions, removals, both) through one float32 factor, kept and updated: every solve,
    fresh or updated, is finished by conjugate gradients to numpy's float64 solve of the same system, and no solve
    is left unrefined for the active-set rounds to polish."""
    _float32_everywhere(monkeypatch)
    n = 400
    K = _kernel(n, gamma=0.1)
    gen = torch.Generator().manual_seed(1)
    d = 0.1 * (1.0 + torch.rand(n, generator=gen, dtype=torch.float64))
    free = torch.sort(torch.randperm(n, generator=gen)[:300]).values
    factor = ff.FreeFactor(cholesky_shifted)
    for step in range(12):
        V = torch.randn(free.numel(), 2, generator=gen, dtype=torch.float64)
        X = factor.solve(K, free, d, V)
        assert X.dtype == torch.float64 and not factor.updated
        _check(K, d, free, V, X, 1e-12)
        out = torch.ones(n, dtype=torch.bool)
        out[free] = False
        outside = torch.nonzero(out).reshape(-1)
        add = outside[torch.randperm(outside.numel(), generator=gen)[: step % 4 * 3]]
        drop = free[torch.randperm(free.numel(), generator=gen)[: (step + 1) % 3 * 4]]
        free = torch.sort(torch.cat([free[~torch.isin(free, drop)], add])).values
    assert factor.L0.dtype == torch.float32 and not factor.float32_failed
    assert factor.updates >= 6 and factor.finished_by_cg == 12


def test_float32_factor_declines_a_block_too_ill_conditioned_for_float32(monkeypatch):
    """A block whose condition number is beyond float32 (a nearly flat kernel, a tiny diagonal) either fails the
    float32 factorisation or leaves the conjugate gradients short of their tolerance: the block is factored in
    float64 (a float64 factorisation's backward error), and float32 is not tried again for this factor."""
    _float32_everywhere(monkeypatch)
    n = 300
    K = _kernel(n, gamma=0.01)
    d = torch.full((n,), 1e-9, dtype=torch.float64)
    free = torch.arange(n)
    V = torch.randn(n, 1, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    factor = ff.FreeFactor(cholesky_shifted)
    X = factor.solve(K, free, d, V)
    assert factor.float32_failed and factor.finished_by_cg == 0 and factor.L0.dtype == torch.float64
    H = K + torch.diag(d)
    backward = (V - H @ X).abs().max() / (V.abs().max() + H.abs().sum(1).max() * X.abs().max())
    assert backward <= 1e-15  # a float64 factorisation's backward error (float32's would be ~1e-7)
    assert not factor._float32_worth(K, free)
    # a later factor of the same problem (the working set's next subproblems) is told so, and starts in float64
    assert ff.FreeFactor(cholesky_shifted)._float32_worth(K, free)
    assert not ff.FreeFactor(cholesky_shifted, float32=False)._float32_worth(K, free)


def test_hinge_fit_through_float32_free_factors_matches_libsvm(monkeypatch):
    """The hinge loss with an intercept by the working-set engine, every large free block factored in float32 (the
    thresholds lowered to this problem's size) and its solves finished in float64: the fit is certified, went
    through such factors, and its primal objective is LIBSVM's at a tight tolerance, or below it."""
    from sklearn.datasets import make_classification
    from sklearn.svm import SVC

    from joker_ext import JokerClassifier

    monkeypatch.setattr(ff, "FLOAT32_FREE_MIN", 64)
    monkeypatch.setattr(ff, "FLOAT32_WORTH", 0)
    finished = _outcomes(monkeypatch, "_finished")
    X, y = make_classification(n_samples=800, n_features=8, flip_y=0.05, random_state=3)
    X = (X - X.mean(0)) / X.std(0)
    C, gamma = 100.0, 1.0  # a wide kernel's near-interpolation: most coordinates free
    est = JokerClassifier(loss="hinge", C=C, gamma=gamma, fit_intercept=True).fit(X, y)
    assert any(finished) and est.relative_gap_ <= 1e-10
    ref = SVC(C=C, gamma=gamma, tol=1e-10).fit(X, y)
    K = rbf_kernel(X, gamma=gamma)
    a = np.zeros(len(y))
    a[ref.support_] = ref.dual_coef_.ravel()
    f = K @ a + ref.intercept_[0]
    primal = 0.5 * a @ (K @ a) + C * np.maximum(0.0, 1.0 - np.where(y == 1, 1.0, -1.0) * f).sum()
    # LIBSVM's tolerance bounds its KKT violation, not its objective: it ends a little above the optimum (1.4e-6
    # relative here), never below it
    assert -1e-5 * primal <= est.primal_objective_ - primal <= 1e-12 * primal
