"""JokerFalkon (joker_ext's Gaussian kernel, Nystrom features, Falkon's default maxiter) with the piecewise-quadratic
and kinked losses at a tiny penalty (5e-9) and a wide kernel (sigma 4, d = 4), on the CPU and on CUDA in one process
(status, iterations, relative gap, the primal objectives' relative difference); then n = 100,000, M = 2000 on CUDA at
penalties 1e-6 and 1e-8. Needs a CUDA device; no Falkon. One JSON line per fit::

    python -m joker_ext.comparisons.benchmarks.nystrom_losses_cuda
"""
import json
import time
import warnings

import torch
from joker_ext import JokerFalkon
from joker_ext.kernels import GaussianKernel


def toy(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    noise = 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    Y = (torch.sin(2 * X[:, 0]) + 0.5 * X[:, 1] ** 2 + noise).reshape(-1, 1)
    return X, Y


def fit(loss, X, Y, sigma, pen, M, dev, maxiter=20):
    if loss in ("squared_hinge", "hinge"):
        Y = torch.where(Y > Y.median(), 1.0, -1.0).to(Y.dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dev == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        m = JokerFalkon(GaussianKernel(sigma), pen, M, seed=0, loss=loss, device=dev, maxiter=maxiter).fit(X, Y)
        if dev == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
    return {"loss": loss, "n": X.shape[0], "M": M, "pen": pen, "device": dev, "fit_s": round(dt, 3),
            "status": m.status_, "iters": m.n_iter_, "rel_gap": m.relative_gap_, "primal": m.result_.primal}


def main():
    print(torch.cuda.get_device_name(0), flush=True)
    fit("huber", *toy(500, 4, 0), 4.0, 1e-6, 100, "cuda")  # warm-up
    for loss, n in [("huber", 1500), ("squared_hinge", 1000), ("absolute", 1000), ("epsilon_insensitive", 1500),
                    ("pinball", 1500), ("hinge", 1500)]:
        X, Y = toy(n, 4, 2)
        rows = [fit(loss, X, Y, 4.0, 5e-9, n // 5, dev) for dev in ("cpu", "cuda")]
        rows[1]["primal_rel_to_cpu"] = abs(rows[1]["primal"] - rows[0]["primal"]) / abs(rows[0]["primal"])
        for r in rows:
            print(json.dumps(r), flush=True)
    X, Y = toy(100_000, 8, 3)
    for loss in ["huber", "epsilon_insensitive", "absolute", "squared_hinge", "pinball"]:
        for pen in (1e-6, 1e-8):
            print(json.dumps(fit(loss, X, Y, 3.0, pen, 2000, "cuda")), flush=True)


if __name__ == "__main__":
    main()
