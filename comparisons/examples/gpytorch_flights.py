"""The GPyTorch workflow with joker_ext, on the NYC flights of 2013 (arrival delay).

1. Hyperparameters are learned the GPyTorch way: an exact GP (ScaleKernel(RBF with ARD), constant mean,
   Gaussian likelihood) trained by Adam on the exact marginal likelihood of a subset (``--n-sub``, 2,000
   points by default). Its posterior mean on that subset is GPyTorch's exact answer.
2. :class:`joker_ext.JokerGP` takes the *trained* modules as they are and fits the posterior mean on a
   large part of the training split (``--n-train``, default 100k of about 262k points; 0 for all) with
   ``--M`` random features, within a time budget (``--joker-time``). The same modules with
   ``loss='huber'`` give a robust fit (arrival delays are heavy-tailed). A closed-form solve with the same
   features (the M x M normal equations, O(n M^2)) separates the solver's remaining optimisation error
   from the random-feature approximation; the exact kernel on the subset reproduces GPyTorch's exact GP.
3. GPyTorch's own scalable answer for comparison: an SVGP (``--inducing`` inducing points, learned
   locations, whitened variational strategy) trained by minibatch Adam on the variational ELBO over the same
   training split, starting from the exact GP's hyperparameters. (KISS-GP needs a grid in each of the 25
   input dimensions and is not feasible here.)

Prints a table of test RMSE / MAE (minutes) and wall-clock times. Run::

    python -m joker_ext.comparisons.examples.gpytorch_flights            # defaults
    python -m joker_ext.comparisons.examples.gpytorch_flights --quick    # 50k points, M=512, shorter budgets
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def _rmse(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((pred - y) ** 2)))


def _mae(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - y)))


def train_exact_gp(X: torch.Tensor, y: torch.Tensor, iters: int, lr: float):
    """GPyTorch exact GP, Adam on the exact marginal likelihood (Cholesky)."""
    import gpytorch

    class ExactGP(gpytorch.models.ExactGP):
        def __init__(self, x, t, likelihood):
            super().__init__(x, t, likelihood)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=x.shape[1]))

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    model = ExactGP(X, y, likelihood).double()
    model.train()
    likelihood.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)  # includes the likelihood's parameters
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with gpytorch.settings.max_cholesky_size(100_000):
        for _ in range(iters):
            opt.zero_grad()
            loss = -mll(model(X), y)
            loss.backward()
            opt.step()
    model.eval()
    likelihood.eval()
    return model, likelihood, float(loss.detach())


def exact_gp_predict(model, X: torch.Tensor) -> torch.Tensor:
    import gpytorch

    with torch.no_grad(), gpytorch.settings.fast_computations(False, False, False), \
            gpytorch.settings.max_cholesky_size(100_000):
        return torch.cat([model(X[i:i + 4096]).mean for i in range(0, len(X), 4096)])


def train_svgp(X: torch.Tensor, y: torch.Tensor, init, n_inducing: int, epochs: int, batch: int, lr: float,
               seed: int, time_budget: float):
    """GPyTorch SVGP (float32, minibatch Adam on the ELBO), initialised from the exact GP's hyperparameters."""
    import gpytorch

    g = torch.Generator().manual_seed(seed)
    Z = X[torch.randperm(len(X), generator=g)[:n_inducing]].clone()

    class SVGP(gpytorch.models.ApproximateGP):
        def __init__(self, Z):
            vd = gpytorch.variational.CholeskyVariationalDistribution(Z.shape[0])
            vs = gpytorch.variational.VariationalStrategy(self, Z, vd, learn_inducing_locations=True)
            super().__init__(vs)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=Z.shape[1]))

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    exact_model, exact_lik = init
    model = SVGP(Z)
    lik = gpytorch.likelihoods.GaussianLikelihood()
    with torch.no_grad():
        model.covar_module.outputscale = float(exact_model.covar_module.outputscale)
        model.covar_module.base_kernel.lengthscale = exact_model.covar_module.base_kernel.lengthscale.float()
        model.mean_module.constant = float(exact_model.mean_module.constant)
        lik.noise = float(exact_lik.noise)
    model.train()
    lik.train()
    opt = torch.optim.Adam(list(model.parameters()) + list(lik.parameters()), lr=lr)
    mll = gpytorch.mlls.VariationalELBO(lik, model, num_data=len(X))
    t0 = time.perf_counter()
    steps = 0
    done_epochs = 0.0
    for ep in range(epochs):
        perm = torch.randperm(len(X), generator=g)
        for i in range(0, len(X), batch):
            idx = perm[i:i + batch]
            opt.zero_grad()
            loss = -mll(model(X[idx]), y[idx])
            loss.backward()
            opt.step()
            steps += 1
            if time.perf_counter() - t0 > time_budget:
                break
        done_epochs = ep + min(1.0, (i + batch) / len(X))
        if time.perf_counter() - t0 > time_budget:
            break
    model.eval()
    lik.eval()
    return model, steps, done_epochs


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-sub", type=int, default=2000, help="subset for GPyTorch's hyperparameter training")
    ap.add_argument("--n-train", type=int, default=100_000,
                    help="training points for JokerGP / SVGP (0: the whole training split, about 262k)")
    ap.add_argument("--n-test", type=int, default=20000)
    ap.add_argument("--M", type=int, default=1024, help="random features of JokerGP")
    ap.add_argument("--no-closed-form", dest="closed_form", action="store_false",
                    help="skip the closed-form solve with the same features (O(n M^2))")
    ap.add_argument("--gp-iters", type=int, default=60)
    ap.add_argument("--joker-time", type=float, default=300.0, help="time budget of each JokerGP fit (s)")
    ap.add_argument("--inducing", type=int, default=512)
    ap.add_argument("--svgp-epochs", type=int, default=5)
    ap.add_argument("--svgp-time", type=float, default=180.0, help="time budget of the SVGP training (s)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="n-train 50k, M 1024, shorter budgets")
    args = ap.parse_args(argv)
    if args.quick:
        args.n_train = 50_000
        args.M = 512
        args.gp_iters = 40
        args.joker_time = 60.0
        args.svgp_epochs = 2
        args.svgp_time = 60.0
    if args.threads:
        torch.set_num_threads(args.threads)

    from joker_ext.comparisons.datasets import flights
    from joker_ext import JokerGP

    t = time.perf_counter()
    ds = flights(task="regression", n_train=args.n_train or None, n_test=args.n_test, seed=args.seed, standardize_y=True)
    y_mean, y_std = ds.info["y_mean"], ds.info["y_std"]
    X = torch.from_numpy(ds.X_train)
    y = torch.from_numpy(ds.y_train)
    Xt = torch.from_numpy(ds.X_test)
    y_test_min = ds.y_test * y_std + y_mean
    print(f"flights: {len(X)} train, {len(Xt)} test, {X.shape[1]} features "
          f"(loaded in {time.perf_counter() - t:.1f}s); delay std {y_std:.1f} min")

    def minutes(pred_std: torch.Tensor) -> np.ndarray:
        return pred_std.detach().double().cpu().numpy() * y_std + y_mean

    rows = []
    # 1. GPyTorch exact GP: hyperparameters on a subset
    g = torch.Generator().manual_seed(args.seed)
    sub = torch.randperm(len(X), generator=g)[: args.n_sub]
    t = time.perf_counter()
    model, lik, nmll = train_exact_gp(X[sub], y[sub], args.gp_iters, 0.1)
    t_train = time.perf_counter() - t
    t = time.perf_counter()
    p = minutes(exact_gp_predict(model, Xt))
    rows.append(("GPyTorch exact GP (subset)", args.n_sub, t_train + time.perf_counter() - t, _rmse(p, y_test_min),
                 _mae(p, y_test_min), f"Adam {args.gp_iters} it, {t_train:.0f}s"))
    ls = model.covar_module.base_kernel.lengthscale.detach().reshape(-1)
    noise_v, os_v = float(lik.noise.detach()), float(model.covar_module.outputscale.detach())
    print(f"exact GP hyperparameters after {args.gp_iters} Adam steps (-mll/n = {nmll:.4f}): "
          f"noise {noise_v:.4f}, outputscale {os_v:.4f}, mean {float(model.mean_module.constant.detach()):.4f}, lengthscales in [{float(ls.min()):.2f}, {float(ls.max()):.2f}]")

    # 2. JokerGP on all the training data with the trained modules
    for label, kw in (("JokerGP, squared (= GP mean)", {}), ("JokerGP, huber delta=1", {"loss": "huber", "delta": 1.0})):
        t = time.perf_counter()
        jgp = JokerGP(model.covar_module, lik, model.mean_module, n_features=args.M, max_time=args.joker_time,
                      tol=1e-6, seed=args.seed, **kw).fit(X, y)
        t_fit = time.perf_counter() - t
        p = minutes(jgp.predict(Xt))
        if not kw:
            jgp_sq = jgp
        rows.append((f"{label}, M={args.M}", len(X), time.perf_counter() - t, _rmse(p, y_test_min), _mae(p, y_test_min),
                     f"{jgp.n_iter_} blocks, gap {jgp.relative_gap_:.1e} ({jgp.status_}), fit {t_fit:.0f}s"))
        print(rows[-1], flush=True)

    # 2b. The same random features, solved in closed form (M x M system): separates the optimisation error of
    #     the time-limited Joker fit from the random-feature approximation
    if args.closed_form:
        t = time.perf_counter()
        fm = jgp_sq.feature_map_
        A = torch.zeros(args.M, args.M, dtype=torch.float64)
        b = torch.zeros(args.M, dtype=torch.float64)
        m0 = float(model.mean_module.constant.detach())
        for i in range(0, len(X), 4096):
            P = fm(X[i:i + 4096])
            A += P.T @ P
            b += P.T @ (y[i:i + 4096] - m0)
        beta = torch.linalg.solve(A + noise_v * torch.eye(args.M, dtype=torch.float64), b)
        p = minutes(torch.cat([fm(Xt[i:i + 4096]) @ beta for i in range(0, len(Xt), 4096)]) + m0)
        rel = float((jgp_sq.beta_ - beta).norm() / beta.norm())
        rows.append((f"same features, closed form (reference)", len(X), time.perf_counter() - t, _rmse(p, y_test_min),
                     _mae(p, y_test_min), f"JokerGP beta rel. error {rel:.1e}"))

    # 3. JokerGP on the subset, exact kernel: the same numbers as GPyTorch's exact GP
    t = time.perf_counter()
    jsub = JokerGP(model.covar_module, lik, model.mean_module, block_size=512, tol=1e-10,
                   max_time=args.joker_time).fit(X[sub], y[sub])
    p_sub = jsub.predict(Xt)
    ref_sub = exact_gp_predict(model, Xt)
    diff = float((p_sub - ref_sub).norm() / ref_sub.norm())
    p = minutes(p_sub)
    rows.append(("JokerGP exact kernel (subset)", args.n_sub, time.perf_counter() - t, _rmse(p, y_test_min),
                 _mae(p, y_test_min), f"rel. diff to GPyTorch mean {diff:.1e}"))

    # 4. GPyTorch SVGP on the same training data
    Xf, yf = X.float(), y.float()
    t = time.perf_counter()
    svgp, steps, ep = train_svgp(Xf, yf, (model, lik), args.inducing, args.svgp_epochs, 1024, 0.01, args.seed,
                                 args.svgp_time)
    t_fit = time.perf_counter() - t
    with torch.no_grad():
        p = minutes(torch.cat([svgp(Xt[i:i + 4096].float()).mean for i in range(0, len(Xt), 4096)]))
    rows.append((f"GPyTorch SVGP, {args.inducing} inducing", len(X), time.perf_counter() - t, _rmse(p, y_test_min),
                 _mae(p, y_test_min), f"{steps} steps ({ep:.1f} epochs), fit {t_fit:.0f}s"))
    p = np.full_like(y_test_min, y_mean)
    rows.append(("constant (training mean)", len(X), 0.0, _rmse(p, y_test_min), _mae(p, y_test_min), ""))

    w = max(len(r[0]) for r in rows)
    print()
    print(f"{'model':<{w}}  {'n fit':>7}  {'time s':>7}  {'RMSE min':>8}  {'MAE min':>7}  notes")
    for name, n, secs, rmse, mae, note in rows:
        print(f"{name:<{w}}  {n:>7}  {secs:>7.1f}  {rmse:>8.3f}  {mae:>7.3f}  {note}")
    return {"rows": rows}


if __name__ == "__main__":
    main()
