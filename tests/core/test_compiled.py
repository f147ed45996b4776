"""The compiled loops are loaded at import, with the very types the fits call them with (joker_ext.compiled).

Each check runs in a fresh interpreter: numba's dispatchers only ever gain signatures, so what this test process
did before would hide a missing one. In one interpreter the loops are left to their first call
(``JOKER_EXT_LAZY_LOAD=1``) and a handful of fits (hinge with and without an intercept, with blocks of shrunk
coordinates and rows from the cache; epsilon-insensitive; squared loss with its float32 factor; one-vs-rest on
threads; one-vs-one) record what they compile or read from numba's cache; in another, joker_ext is only imported.
Every signature the fits needed must be among those the import loaded: otherwise the first fit of a process reads or
compiles machine code after all.
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")

CHILD = r"""
import json, sys
import joker_ext
from joker_ext import dense, kernel_rows, one_vs_one, smo
from numba.core.dispatcher import Dispatcher

if sys.argv[1] == "fits":
    from sklearn.datasets import make_classification, make_regression
    from joker_ext import JokerClassifier, JokerRegressor

    X, y = make_classification(n_samples=1200, n_features=30, n_informative=10, random_state=0)
    for intercept in (True, False):
        JokerClassifier(loss="hinge", C=10.0, fit_intercept=intercept).fit(X, y)
    X, y = make_regression(n_samples=1200, n_features=6, noise=1.0, random_state=0)
    y = y / y.std()
    JokerRegressor(loss="epsilon_insensitive", C=10.0, epsilon=0.1, fit_intercept=True).fit(X, y)
    JokerRegressor(loss="squared", C=10.0).fit(X, y)
    X, y = make_classification(n_samples=600, n_features=6, n_informative=4, n_classes=3, random_state=0)
    JokerClassifier(loss="hinge", C=10.0, fit_intercept=True, multi_class="ovr").fit(X, y)
    JokerClassifier(loss="hinge", C=10.0, fit_intercept=True, multi_class="ovo").fit(X, y)
print(json.dumps({f"{m.__name__}.{k}": [str(s) for s in v.signatures] for m in (dense, kernel_rows, one_vs_one, smo)
                  for k, v in vars(m).items() if isinstance(v, Dispatcher)}))
"""

#: The loops the fits above call from Python (each must be used, or the test would prove nothing).
CALLED = {"joker_ext.smo._pair_steps", "joker_ext.smo._free_sum_steps", "joker_ext.smo._add_rows",
          "joker_ext.smo._unshrink", "joker_ext.dense._gather_compiled", "joker_ext.dense._flush_compiled",
          "joker_ext.kernel_rows._transpose_divided", "joker_ext.one_vs_one._solve_range"}


def _signatures(what: str, lazy: bool) -> dict:
    env = dict(os.environ, JOKER_EXT_LAZY_LOAD="1" if lazy else "0")
    out = subprocess.run([sys.executable, "-c", CHILD, what], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_import_loads_every_loop_the_fits_call_with_their_types():
    # twice: a first run compiles what numba's cache lacks, and a loop compiled in a process lists signatures for the
    # loops it calls too; the second reads every loop from the cache and lists only those called from Python
    _signatures("fits", lazy=True)
    used = _signatures("fits", lazy=True)
    loaded = _signatures("import", lazy=False)
    assert CALLED <= {name for name, sigs in used.items() if sigs}
    for name, sigs in used.items():
        missing = set(sigs) - set(loaded[name])
        assert not missing, f"{name}: the fits compiled {sorted(missing)}, which the import did not load"


def test_lazy_load_leaves_the_loops_to_their_first_call():
    assert not any(_signatures("import", lazy=True).values())


def test_a_loop_that_fails_to_load_warns_instead_of_breaking_the_import(monkeypatch):
    from joker_ext import compiled, smo

    def broken(*args):
        raise RuntimeError("no machine code for this processor")

    monkeypatch.setattr(smo, "_pair_steps", broken)
    monkeypatch.setattr(compiled, "_cached", lambda dispatcher: True)
    monkeypatch.delenv(compiled.LAZY_LOAD_VARIABLE, raising=False)
    with pytest.warns(RuntimeWarning, match="could not load its compiled loops.*no machine code"):
        compiled.load_unless_lazy()


def test_a_loop_is_loaded_only_when_numbas_cache_holds_it(tmp_path, monkeypatch):
    """:func:`joker_ext.compiled._cached` against numba itself: a fresh ``cache=True`` function has no cache index
    until its first call compiles it; ``load`` calls only the loops whose index exists (the import never compiles)."""
    import numba

    from joker_ext import compiled

    (tmp_path / "fresh_loop.py").write_text("import numba\n\n\n@numba.njit(cache=True)\ndef twice(x):\n"
                                            "    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import fresh_loop

    assert not compiled._cached(fresh_loop.twice)
    assert fresh_loop.twice(3) == 6
    assert compiled._cached(fresh_loop.twice)
    assert not compiled._cached(object())  # (nothing numba caches)

    @numba.njit(cache=True)
    def uncached(x):
        return x

    called = []
    monkeypatch.setattr(compiled, "_calls", lambda: [(fresh_loop.twice, lambda: called.append("cached")),
                                                     (uncached, lambda: called.append("not cached"))])
    compiled.load()
    assert called == ["cached"]


def test_compile_all_calls_every_loop_cached_or_not(monkeypatch):
    """``python -m joker_ext.precompile`` (:func:`compile_all`) compiles the loops numba's cache lacks too (``load``
    only reads those it holds), and reports each one."""
    from joker_ext import compiled

    calls, lines = [], []
    monkeypatch.setattr(compiled, "_cached", lambda dispatcher: dispatcher == "cached")
    monkeypatch.setattr(compiled, "_calls", lambda: [("cached", lambda: calls.append("cached")),
                                                     ("missing", lambda: calls.append("missing"))])
    compiled.compile_all(report=lines.append)
    assert calls == ["cached", "missing"]
    assert [line.split(":")[0] for line in lines] == ["cached", "missing"]
    calls.clear()
    compiled.load()
    assert calls == ["cached"]
