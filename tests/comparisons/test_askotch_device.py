"""The ASkotch per-iteration benchmark (``askotch_device``): its work count and a CPU smoke run."""
import pytest
import torch

from joker_ext.comparisons.benchmarks import askotch_device


def test_iteration_flops_counts_the_terms_of_an_iteration():
    # |b| = 200, r = 100, n = 20,000, d = 8, 10 power iterations, term by term
    n, d, b, r = 20_000, 8, 200, 100
    expected = 2 * b * n * (d + 1) + 2 * b * b * d + 2 * b * b * r + 6 * b * r * r + 10 * (2 * b * b + 8 * b * r)
    assert askotch_device.iteration_flops(n, d, b, r, 10) == pytest.approx(expected, rel=1e-15)
    # the kernel product with all n points dominates: linear in n
    assert askotch_device.iteration_flops(2 * n, d, b, r) - askotch_device.iteration_flops(n, d, b, r) == \
        pytest.approx(2 * b * n * (d + 1))


def test_cpu_run_prints_time_work_and_rmse(capsys):
    askotch_device.main(["--n-train", "2000", "--iters", "5"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("cpu:")]
    assert len(lines) == 2
    assert all("ms per iteration (5 iterations, blocks of 20, rank 20)" in line and "test RMSE" in line
               for line in lines)


def test_count_ops_sees_the_power_iterations_as_three_products_each(capsys):
    """Each of the step size's 10 power iterations is ``S (H (S v))`` with ``S = (P + rho I)^{-1/2}`` formed once:
    three matrix products (two Woodbury applications of ``P^{-1/2}`` per iteration made it about 28 operations, 448
    per ASkotch iteration in all, 79 of them ``mm``)."""
    askotch_device.main(["--n-train", "2000", "--iters", "2", "--count-ops"])
    line = next(x for x in capsys.readouterr().out.splitlines() if "tensor operations per iteration" in x)
    assert 100 < float(line.split()[0]) < 300, line
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(1000, 4, generator=g, dtype=torch.float64), torch.randn(1000, generator=g, dtype=torch.float64)
    ops = askotch_device.count_ops(X, y, 1e-2, torch.device("cpu"), iters=3)
    assert 3 * 10 <= ops["mm"] <= 3 * 10 + 12, ops
