"""Compile joker_ext's numba loops now: ``python -m joker_ext.precompile`` (once per installation, about 20 s on one
core; see :mod:`joker_ext.compiled`). Without it, the first fit that calls a loop compiles it."""
from .compiled import compile_all

if __name__ == "__main__":
    compile_all()
