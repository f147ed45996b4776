"""joker_ext.dense.cholesky_ex against torch.linalg.cholesky_ex and the defining property H = L L^T (SciPy's path,
taken when torch runs on one thread, unless a test says otherwise); its gathers (rows_product, submatrix) against
plain indexing."""
import pytest
import torch

import numpy as np

import joker_ext.dense as dense
from joker_ext.dense import RefinedCholesky, cholesky_ex, cholesky_pcg, cholesky_solve, rows_product


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _spd(m: int, dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(m, m, generator=g, dtype=torch.float64)
    return (A @ A.T / m + 1e-3 * torch.eye(m, dtype=torch.float64)).to(dtype)


@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-12), (torch.float32, 2e-4)])
@pytest.mark.parametrize("m", [1, 7, 130])
@pytest.mark.parametrize("upper", [False, True])
def test_factor_matches_torch_and_reproduces_the_matrix(dtype, rtol, m, upper):
    H = _spd(m, dtype)
    before = H.clone()
    F, info = cholesky_ex(H, upper=upper)
    F_ref, info_ref = torch.linalg.cholesky_ex(H, upper=upper)
    assert int(info) == int(info_ref) == 0
    assert torch.equal(H, before)  # the input is not modified
    assert F.dtype == dtype and F.shape == (m, m)
    tri = torch.triu(F, 1) if not upper else torch.tril(F, -1)
    assert torch.count_nonzero(tri) == 0  # the other triangle is zero, as torch returns it
    scale = float(H.abs().max())
    torch.testing.assert_close(F, F_ref, rtol=rtol, atol=rtol * scale ** 0.5)
    product = F @ F.mT if not upper else F.mT @ F
    torch.testing.assert_close(product, H, rtol=rtol, atol=rtol * scale)


def test_reads_only_the_lower_triangle_and_takes_strided_views():
    H = _spd(40, torch.float64, seed=1)
    junk = H.clone()
    junk.triu_(1).add_(1e6)  # garbage above the diagonal must not matter
    L, info = cholesky_ex(torch.tril(H) + junk.triu(1))
    assert int(info) == 0
    torch.testing.assert_close(L @ L.T, H, rtol=1e-12, atol=1e-12)
    big = _spd(80, torch.float64, seed=2)
    view = big[::2, ::2]  # a non-contiguous principal submatrix
    L, info = cholesky_ex(view)
    torch.testing.assert_close(L, torch.linalg.cholesky(view.contiguous()), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("upper", [False, True])
def test_overwrite_factors_in_the_matrixs_own_memory(threads, upper):
    """``overwrite``: the factor is ``H`` itself (no second matrix), the same factor to rounding, on either path
    (SciPy's on one thread, torch's on two); a matrix that is not positive definite reports its minor as before."""
    torch.set_num_threads(threads)
    H = _spd(200, torch.float64, seed=5)
    F_ref, _ = torch.linalg.cholesky_ex(H, upper=upper)
    work = H.clone()
    F, info = cholesky_ex(work, upper=upper, overwrite=True)
    assert int(info) == 0 and F.data_ptr() == work.data_ptr()
    tri = torch.triu(F, 1) if not upper else torch.tril(F, -1)
    assert torch.count_nonzero(tri) == 0
    torch.testing.assert_close(F, F_ref, rtol=1e-12, atol=1e-12)
    bad = _spd(30, torch.float64, seed=3)
    bad[12, 12] = -1.0
    assert int(cholesky_ex(bad.clone(), overwrite=True)[1]) == int(torch.linalg.cholesky_ex(bad)[1]) == 13


def test_info_names_the_failing_minor_as_torch_does():
    H = _spd(30, torch.float64, seed=3)
    H[12, 12] = -1.0  # the leading minor of order 13 is not positive definite
    _, info = cholesky_ex(H)
    _, info_ref = torch.linalg.cholesky_ex(H)
    assert int(info) == int(info_ref) == 13


def test_other_tensors_go_to_torch():
    H = _spd(5, torch.float64).requires_grad_(True)
    L, info = cholesky_ex(H)  # autograd needs torch's own factorisation
    assert int(info) == 0 and L.requires_grad
    L.sum().backward()
    assert H.grad is not None
    batch = torch.stack([_spd(6, torch.float64, seed=s) for s in range(3)])
    Lb, infob = cholesky_ex(batch)
    assert Lb.shape == (3, 6, 6) and torch.all(infob == 0)
    torch.testing.assert_close(Lb @ Lb.mT, batch)


@pytest.mark.parametrize("threads", [1, 2])
def test_either_path_and_scipy_threads_restored(threads):
    from threadpoolctl import threadpool_info

    def blas_threads():
        return sorted((lib["filepath"], lib["num_threads"]) for lib in threadpool_info() if lib["user_api"] == "blas")

    H = _spd(300, torch.float64, seed=4)
    before_blas = blas_threads()
    torch.set_num_threads(threads)  # 1: SciPy's LAPACK on one thread; 2: torch's own
    L, info = cholesky_ex(H)
    assert int(info) == 0
    torch.testing.assert_close(L @ L.T, H, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(L, torch.linalg.cholesky(H), rtol=1e-12, atol=1e-12)
    assert blas_threads() == before_blas  # the one-thread limit is lifted after the call


def test_working_set_on_one_thread_reaches_libsvm():
    """The engines on SciPy's factorisation (torch on one thread): an epsilon-insensitive SVR with intercept at the
    rounding floor, its primal objective at most LIBSVM's at tol 1e-10 and equal to the two-thread fit's (torch's
    factorisation) to 1e-10."""
    import numpy as np
    from sklearn.datasets import make_regression
    from sklearn.metrics.pairwise import rbf_kernel
    from sklearn.svm import SVR

    from joker_ext import JokerRegressor

    X, y = make_regression(n_samples=500, n_features=6, noise=10.0, random_state=1)
    X, y = (X - X.mean(0)) / X.std(0), (y - y.mean()) / y.std()
    gamma, C, eps = 0.1, 10.0, 0.1
    K = rbf_kernel(X, gamma=gamma)

    def primal(a, f):
        return 0.5 * a @ K @ a + C * np.maximum(0.0, np.abs(y - f) - eps).sum()

    def ours():
        est = JokerRegressor(loss="epsilon_insensitive", epsilon=eps, C=C, gamma=gamma, fit_intercept=True).fit(X, y)
        assert est.solver_ == "working_set" and est.relative_gap_ <= 1e-10
        return primal(est.dual_coef_.reshape(-1), est.predict(X))

    one = ours()
    torch.set_num_threads(2)
    two = ours()
    svr = SVR(C=C, gamma=gamma, epsilon=eps, tol=1e-10).fit(X, y)
    a_ref = np.zeros(len(y))
    a_ref[svr.support_] = svr.dual_coef_.reshape(-1)
    assert one <= primal(a_ref, svr.predict(X)) * (1 + 1e-12)
    assert abs(one - two) <= 1e-10 * one


def test_concurrent_factorisations_leave_the_blas_threads_as_they_were():
    """The one-thread limit is process-wide: factorisations overlapping in several threads must restore the user's
    setting once the last one is done (overlapping plain limits restore in the wrong order)."""
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_info

    def blas_threads():
        return sorted((lib["filepath"], lib["num_threads"]) for lib in threadpool_info() if lib["user_api"] == "blas")

    before = blas_threads()
    H = _spd(200, torch.float64, seed=5)

    def work(_):
        return max(float((L @ L.T - H).abs().max()) for L, _ in (cholesky_ex(H) for _ in range(30)))

    with ThreadPoolExecutor(max_workers=4) as pool:
        errors = list(pool.map(work, range(8)))
    assert max(errors) <= 1e-12
    assert blas_threads() == before


@pytest.mark.parametrize("threads", [1, 2])
def test_cholesky_solve_matches_a_plain_solve_for_either_layout(threads):
    """``cholesky_solve`` reads the factor of either path (SciPy's row-major, torch's column-major)."""
    torch.set_num_threads(threads)
    H = _spd(90, torch.float64, seed=6)
    B = torch.randn(90, 3, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    L, info = cholesky_ex(H)
    assert int(info) == 0
    torch.testing.assert_close(cholesky_solve(B, L), torch.linalg.solve(H, B), rtol=1e-10, atol=1e-10)


def test_a_matrix_that_is_not_square_is_refused_as_torch_refuses_it():
    with pytest.raises(RuntimeError, match="square"):
        cholesky_ex(torch.ones(3, 4, dtype=torch.float64))


def _conditioned(m: int, cond: float, seed: int) -> torch.Tensor:
    """An SPD matrix with eigenvalues spread log-uniformly over ``[1, cond]``."""
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=torch.float64))
    return (Q * torch.logspace(0, np.log10(cond), m, dtype=torch.float64)) @ Q.T


@pytest.mark.parametrize("cond", [1e2, 1e5])
def test_refined_cholesky_reaches_float64_accuracy_from_a_float32_factor(cond):
    """A float32 factor refined in float64 solves to float64's accuracy (numpy's float64 solve as the reference) where
    ``cond eps_32 < 1``; without refinements it is only float32-accurate."""
    H = _conditioned(200, cond, seed=1)
    R = torch.randn(200, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    L, info = cholesky_ex(H.to(torch.float32))
    assert int(info) == 0
    reference = np.linalg.solve(H.numpy(), R.numpy())
    refined = RefinedCholesky(L, lambda R, X: R - H @ X, refinements=8, refined=0.0)
    X = refined.solve(R)
    # float64's own residual floor: eps_64 |H| |X| (|H| = cond here)
    assert X.dtype == torch.float64 and refined.residual < 1e-14 * cond * float(X.abs().max() / R.abs().max())
    np.testing.assert_allclose(X.numpy(), reference, rtol=0, atol=1e-13 * cond * np.abs(reference).max())
    plain = RefinedCholesky(L, lambda R, X: R - H @ X, refinements=0, refined=0.0)
    X0 = plain.solve(R)
    assert plain.residual > 1e-9  # float32's rounding, which the refinements removed
    assert np.abs(X0.numpy() - reference).max() > 100 * np.abs(X.numpy() - reference).max()


def test_refined_cholesky_reports_a_factor_too_inexact_to_refine():
    """A factor too far from ``H`` for the refinements to converge (here that of ``0.3 H``, whose refinement
    multiplies the error by ``1 - 1 / 0.3``): the first refinement grows the residual and is dropped, and
    :attr:`residual` stays far above float64's rounding, so that a caller falls back to a float64 factor."""
    H = _conditioned(200, 1e3, seed=3)
    L, info = cholesky_ex((0.3 * H).to(torch.float32))
    assert int(info) == 0
    R = torch.randn(200, 1, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    refined = RefinedCholesky(L, lambda R, X: R - H @ X, refinements=6, refined=0.0)
    X = refined.solve(R)
    assert refined.residual > 1.0  # |R - H (0.3 H)^{-1} R| = (1 / 0.3 - 1) |R|
    reference = torch.linalg.solve(0.3 * H, R)  # the unrefined float32 solve, kept
    torch.testing.assert_close(X, reference, rtol=0, atol=1e-3 * float(reference.abs().max()))


@pytest.mark.parametrize("cond", [1e2, 1e5])
def test_cholesky_pcg_reaches_float64_accuracy_from_a_float32_factor_in_a_few_iterations(cond):
    """Conjugate gradients on a float64 system preconditioned by its own float32 factor: float64's accuracy (numpy's
    float64 solve as the reference) in at most 6 iterations where ``cond eps_32 < 1``, each column of the
    right-hand side on its own, a zero column staying zero."""
    H = _conditioned(200, cond, seed=1)
    R = torch.randn(200, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    R[:, 2] = 0.0
    L, info = cholesky_ex(H.to(torch.float32))
    assert int(info) == 0
    products = []

    def product(X):
        products.append(1)
        return H @ X

    X, residual = cholesky_pcg(L, product, R, tol=1e-15, max_iter=20)
    reference = np.linalg.solve(H.numpy(), R.numpy())
    assert X.dtype == torch.float64 and len(products) <= 6 and residual <= 1e-15
    np.testing.assert_allclose(X.numpy(), reference, rtol=0, atol=1e-13 * cond * np.abs(reference).max())
    assert not X[:, 2].any()
    true_residual = (R[:, :2] - H @ X[:, :2]).norm(dim=0) / R[:, :2].norm(dim=0)
    assert float(true_residual.max()) <= 1e-14 * cond


def test_cholesky_pcg_converges_through_the_factor_of_a_nearby_matrix_where_refinement_diverges():
    """The preconditioner is the float32 factor of another matrix: ``0.3 H`` (where refinement multiplies the error by
    ``1 - 1 / 0.3`` and stops at once: :func:`test_refined_cholesky_reports_a_factor_too_inexact_to_refine`) and
    ``H`` with its rows and columns scaled by up to 10 % (a Newton system at the previous iterate's weights). Both
    reach float64's accuracy; capped below what they need, the residual reported says how far they got."""
    H = _conditioned(200, 1e3, seed=3)
    R = torch.randn(200, 1, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    reference = np.linalg.solve(H.numpy(), R.numpy())
    scale = 1.0 + 0.1 * torch.rand(200, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    for near in (0.3 * H, scale[:, None] * H * scale[None, :]):
        L, info = cholesky_ex(near.to(torch.float32))
        assert int(info) == 0
        X, residual = cholesky_pcg(L, lambda X: H @ X, R, tol=1e-15, max_iter=60)
        assert residual <= 1e-15
        np.testing.assert_allclose(X.numpy(), reference, rtol=0, atol=1e-11 * np.abs(reference).max())
        refined = RefinedCholesky(L, lambda R, X: R - H @ X, refinements=6, refined=0.0)
        refined.solve(R)
        _, early = cholesky_pcg(L, lambda X: H @ X, R, tol=1e-15, max_iter=1)
        true_early = float((R - H @ _).norm() / R.norm())
        assert early == pytest.approx(true_early, rel=1e-6) and early > 1e-10
    assert refined.residual > 1e-10  # (the scaled matrix's factor: refinement stalls above float64's accuracy)


def test_rows_product_is_the_chosen_rows_transposed_times_v(monkeypatch):
    """``rows_product(R, rows, V) = R[rows]^T V`` for one or several columns of ``V`` (the sparse product and the
    chunked dense one), rows in any order; rows not chosen are never read (a cache's rows not yet formed)."""
    monkeypatch.setattr(dense, "PRODUCT_CHUNK_ELEMENTS", 24)  # chunks of two rows on the dense path (the last: one)
    g = torch.Generator().manual_seed(1)
    R = torch.randn(30, 12, generator=g, dtype=torch.float64)
    R[5] = float("nan")
    rows = torch.tensor([7, 2, 29, 11, 0])
    for T in (1, 2, 3, 6):
        V = torch.randn(5, T, generator=g, dtype=torch.float64)
        torch.testing.assert_close(rows_product(R, rows, V), R[rows].T @ V, rtol=1e-14, atol=1e-14)
        none = rows_product(R, rows[:0], V[:0])  # no rows chosen: zeros
        assert none.shape == (12, T) and not bool(none.any())


@pytest.mark.parametrize("compiled", [True, False])
def test_submatrix_is_advanced_indexing(monkeypatch, compiled):
    """:func:`~joker_ext.dense.submatrix` against ``K[rows][:, cols]``: the compiled gather and the
    index_selects (``compiled=False``), into a fresh matrix or a given one (of K's dtype or float32), rows and columns
    in any order."""
    if not compiled:
        monkeypatch.setattr(dense, "_gather_compiled", None)
    elif dense._gather_compiled is None:
        pytest.skip("numba is not installed")
    monkeypatch.setattr(dense, "GATHER_ELEMENTS", 64)  # several chunks of rows on the index_select path
    monkeypatch.setattr(dense, "PREFAULT_ELEMENTS", 100)  # fresh outputs zeroed by torch's threads first
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float64, torch.float32):
        K = torch.randn(50, 40, generator=g, dtype=dtype)
        rows, cols = torch.randperm(50, generator=g)[:17], torch.randperm(40, generator=g)[:23]
        assert torch.equal(dense.submatrix(K, rows, cols), K[rows][:, cols])
        square = K[:40]
        assert torch.equal(dense.submatrix(square, cols), square[cols][:, cols])
        out = torch.full((17 * 23 + 5,), float("nan"), dtype=dtype)
        view = out[:17 * 23].view(17, 23)
        assert dense.submatrix(K, rows, cols, out=view).data_ptr() == out.data_ptr()
        assert torch.equal(view, K[rows][:, cols]) and torch.isnan(out[17 * 23:]).all()
        assert dense.submatrix(K, rows[:0]).shape == (0, 0)
    # a float64 matrix gathered into a float32 block: the entries rounded once
    K = torch.randn(50, 40, generator=g, dtype=torch.float64)
    out = torch.empty(17, 23, dtype=torch.float32)
    assert torch.equal(dense.submatrix(K, rows, cols, out=out), K[rows][:, cols].to(torch.float32))


@pytest.mark.parametrize("compiled", [True, False])
def test_float32_flushed_is_the_float32_rounding_less_the_entries_below_eps32_squared_of_the_diagonal(
        monkeypatch, compiled):
    """Against numpy's float32 rounding: entries below ``eps_32^2 max |H_ii|`` become zero (subnormal ones among
    them), the others are rounded as numpy rounds them; a transposed view gives the transposed matrix. A Gaussian
    kernel matrix whose far entries reach 1e-48 then factors in float32 with no subnormal number in its factor, and
    its refined solves reach float64's accuracy (numpy's float64 solve as the reference)."""
    if not compiled:
        monkeypatch.setattr(dense, "_flush_compiled", None)
    elif dense._flush_compiled is None:
        pytest.skip("numba is not installed")
    g = torch.Generator().manual_seed(5)
    H = _spd(60, torch.float64, seed=5)
    floor = np.finfo(np.float32).eps ** 2 * float(H.diagonal().abs().max())
    H[0, 1:7] = torch.tensor([1e-45, -1e-40, 1e-20, 0.5 * floor, -2.0 * floor, 0.5], dtype=torch.float64)
    expected = np.where(np.abs(H.numpy()) < floor, 0.0, H.numpy()).astype(np.float32)
    np.testing.assert_array_equal(dense.float32_flushed(H).numpy(), expected)
    np.testing.assert_array_equal(dense.float32_flushed(H.T).numpy(), expected.T)
    np.testing.assert_array_equal(dense.flush_small_(H.to(torch.float32)).numpy(), expected)
    assert dense.float32_flushed(H)[0, 1:7].ne(0).tolist() == [False, False, False, False, True, True]

    x = torch.linspace(0.0, 15.0, 300, dtype=torch.float64).unsqueeze(1)
    K = torch.exp(-0.5 * (x - x.T) ** 2) + 1e-3 * torch.eye(300, dtype=torch.float64)
    assert float(K.min()) < 1e-45
    L, info = cholesky_ex(dense.float32_flushed(K))
    tiny = torch.finfo(torch.float32).tiny
    assert int(info) == 0 and not bool(((L.abs() < tiny) & (L != 0)).any())
    R = torch.randn(300, 1, generator=g, dtype=torch.float64)
    X = RefinedCholesky(L, lambda R, X: R - K @ X, refinements=8, refined=0.0).solve(R)
    reference = np.linalg.solve(K.numpy(), R.numpy())
    np.testing.assert_allclose(X.numpy(), reference, rtol=0, atol=1e-11 * np.abs(reference).max())
