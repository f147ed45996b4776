"""The reference-row benchmarks' own plumbing (the authors' code itself is not available to CI)."""
from __future__ import annotations

import types

import numpy as np
import torch

from joker_ext.comparisons.benchmarks.admm_svm_reference import parse_their_output, their_bias, write_their_format

# the shape of the authors' driver's printout (KernelSVM_final.cpp on STRUMPACK 5.1.0), numbers made up
PRINTOUT = """# usage: ./SVM_ADMM file d kernel(Gauss, Laplace) mode(validation, test)
# ADMM beta           = 100
# kernel h            = 1
# p                   = 1
# k-ANN=512, approximate neighbor search time = 0.33
# HSS compression time = 0.5
# rank(H) = 17
# factorization time = 0.05
# solve time = 0.0025
# C parameter for SVM = 0.1

# ADMM Procedure 
# Primal Res = 0
# Training Time = 0.014
# bias: -0.41
# prediction score: 68%
# c-err: 32%

# C parameter for SVM = 10

# ADMM Procedure 
# Training Time = 0.018
# prediction score: 68.8%
# kernel h            = 10
# HSS compression time = 2
# rank(H) = 5
# factorization time = 1
# solve time = 1
# C parameter for SVM = 1
# Training Time = 0.5
# prediction score: 80.25%
"""


def test_parse_their_output_blocks_by_h_and_C():
    out = parse_their_output(PRINTOUT)
    assert sorted(out) == [1.0, 10.0]
    b = out[1.0]
    assert b["rank"] == 17
    assert abs(b["setup"] - (0.5 + 0.05 + 0.0025)) < 1e-12  # the ANN search is inside the compression time
    assert b["C"][0.1] == {"admm": 0.014, "accuracy": 0.68}
    assert abs(b["C"][10.0]["accuracy"] - 0.688) < 1e-12
    assert out[10.0]["C"][1.0] == {"admm": 0.5, "accuracy": 0.8025}
    assert out[10.0]["setup"] == 4.0


def test_write_their_format_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    X, Xt = rng.normal(size=(7, 3)), rng.normal(size=(4, 3))
    y, yt = np.array([1, -1, 1, 1, -1, -1, 1]), np.array([-1, 1, 1, -1])
    prefix = str(tmp_path / "d")
    write_their_format(prefix, X, y, Xt, yt)
    np.testing.assert_array_equal(np.loadtxt(prefix + "_train.csv", delimiter=","), X)  # %.17g: exact
    np.testing.assert_array_equal(np.loadtxt(prefix + "_test.csv", delimiter=","), Xt)
    np.testing.assert_array_equal(np.loadtxt(prefix + "_train_label.csv"), y)
    np.testing.assert_array_equal(np.loadtxt(prefix + "_test_label.csv"), yt)


def test_their_bias_drops_the_kernel():
    # free: 1e-5 < z < C - 1e-5 -> entries 1 and 2 (z = 0.5 and 0.25 with C = 1)
    svm = types.SimpleNamespace(dual_coef_=torch.tensor([0.0, 0.5, 0.25, 1.0]),
                                y_signs_=torch.tensor([1.0, -1.0, 1.0, 1.0]))
    assert abs(their_bias(svm, 1.0) - np.mean([-1.0 + 0.5, 1.0 - 0.25])) < 1e-12
    none_free = types.SimpleNamespace(dual_coef_=torch.tensor([0.0, 1.0]), y_signs_=torch.tensor([1.0, -1.0]))
    assert their_bias(none_free, 1.0) == 0.0


def test_lapack_top_eigenpairs_answer_as_lobpcg_does():
    """``--eigensolver lapack`` stands in for ``torch.lobpcg(A, k)`` in the authors' EigenPro 2 set-up: the k largest
    eigenpairs, largest first, in A's dtype, as numpy's eigh and lobpcg itself give them."""
    from joker_ext.comparisons.benchmarks.eigenpro_reference import _lapack_top_eigenpairs

    rng = np.random.default_rng(0)
    G = rng.standard_normal((60, 60))
    A = torch.as_tensor(G @ G.T / 60 + np.diag(np.linspace(0.0, 3.0, 60)), dtype=torch.float32)
    values, vectors = _lapack_top_eigenpairs(A, 5)
    assert values.dtype == vectors.dtype == torch.float32 and vectors.shape == (60, 5)
    expected = np.linalg.eigvalsh(A.double().numpy())[::-1][:5]
    np.testing.assert_allclose(values.numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose((A @ vectors).numpy(), (vectors * values).numpy(), atol=1e-4)
    lobpcg_values, _ = torch.lobpcg(A.double(), k=5, niter=500, tol=1e-10)
    np.testing.assert_allclose(values.numpy(), lobpcg_values.numpy(), rtol=1e-4)
