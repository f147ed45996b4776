"""Sphinx configuration of the joker_ext documentation.

Build (warnings are errors)::

    python -m sphinx -W -b html docs docs/_build/html
    python -m sphinx -W -b doctest docs docs/_build/doctest

Everything here works offline: no intersphinx, no external images. Math is rendered in the browser by
MathJax (the HTML pages load it from its CDN when viewed; the build itself needs no network).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A source checkout builds without installing: the repository root holds joker_ext/ and comparisons/
# (joker_ext registers adapters/ as joker_ext.adapters itself).
sys.path.insert(0, str(ROOT))

# Matplotlib must never try to open a window while the API reference is imported.
os.environ.setdefault("MPLBACKEND", "Agg")

project = "joker_ext"
author = "joker_ext developers"
copyright = "joker_ext developers, MIT licence"
try:
    from joker_ext import __version__ as release
except Exception:  # pragma: no cover - the API pages would fail anyway
    release = "0.1.0"
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
]

root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
templates_path: list = []
html_static_path = ["_static"]
html_theme = "alabaster"
html_theme_options = {
    "description": "Kernel machines for any convex loss, at scale",
    "fixed_sidebar": True,
}
html_title = f"joker_ext {release}"
# Cross-references in plain ``backticks`` stay literal text (no guessing of targets).
default_role = "literal"
nitpicky = False

# -- autodoc / numpydoc -------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # numpy-style docstrings state the types
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_mock_imports: list = []
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_validation_checks: set = set()

# -- doctest ------------------------------------------------------------------------------------------
# Every example runs in one process per page, on one thread (the machines building this are small and
# shared), in float64, with a fixed seed. HAVE_FALKON / HAVE_GPYTORCH guard the optional examples
# (``:skipif: not HAVE_FALKON``).
doctest_global_setup = r"""
import contextlib as _contextlib
import io as _io
import numpy as np
import torch
torch.set_num_threads(1)
_ = torch.manual_seed(0)
np.set_printoptions(precision=4, suppress=True)
# Importing Falkon imports KeOps, which prints a notice on machines without CUDA: keep it out of the
# examples' output.
with _contextlib.redirect_stdout(_io.StringIO()):
    try:
        import falkon  # noqa: F401
        HAVE_FALKON = True
    except Exception:
        HAVE_FALKON = False
    try:
        import gpytorch  # noqa: F401
        HAVE_GPYTORCH = True
    except Exception:
        HAVE_GPYTORCH = False
"""
doctest_default_flags = (
    __import__("doctest").ELLIPSIS
    | __import__("doctest").NORMALIZE_WHITESPACE
    | __import__("doctest").DONT_ACCEPT_TRUE_FOR_1
)
# Docstrings of the API are not doctested (their examples are illustrations, e.g. of Falkon runs).
doctest_test_doctest_blocks = ""


# -- hooks --------------------------------------------------------------------------------------------
def _skip_member(app, what, name, obj, skip, options):
    """Leave out the metadata-routing methods scikit-learn generates on every estimator
    (``set_fit_request``, ``set_score_request``, ...): their docstrings point into scikit-learn's own
    glossary, and they are scikit-learn's API, not joker_ext's."""
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def _numpydoc_warnings_as_sphinx_warnings() -> None:
    """numpydoc reports docstring problems (e.g. an unknown section such as "Attributes (after fit)",
    whose content it then drops from the page) with Python's ``warnings``, which ``sphinx -W`` does not
    see. Route them through Sphinx's logger so that they fail a ``-W`` build like any other warning."""
    import warnings

    from sphinx.util import logging as sphinx_logging

    logger = sphinx_logging.getLogger("numpydoc")
    previous = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if "numpydoc" in str(filename):
            logger.warning("numpydoc: %s", message)
        else:
            previous(message, category, filename, lineno, file, line)

    warnings.filterwarnings("always", category=UserWarning, module=r"numpydoc\..*")
    warnings.showwarning = showwarning


def setup(app):
    app.connect("autodoc-skip-member", _skip_member)
    _numpydoc_warnings_as_sphinx_warnings()
