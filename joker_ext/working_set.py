"""Working-set decomposition (``solver='working_set'``) for exact kernels and losses whose conjugate is linear
on its box (hinge, epsilon-insensitive, absolute, pinball: the support-vector losses).

Problem, per target column (the notation of :mod:`joker_ext.active_set`)::

    min_alpha  1/2 alpha^T K alpha + sum_i [-alpha_i (y_i - p0_i) + h_i alpha_i^2 / 2 + kink |alpha_i|]
    s.t.       lo_i <= alpha_i <= hi_i            (and sum_i alpha_i = 0 with an intercept)

Its solutions are sparse: most ``alpha_i`` sit at a bound or at the kink, and only the *free* ones (on the
margin) take values that a linear system decides. The engine reads ``K`` through blocks ``K_BB`` and rows
(all of them, formed lazily, when they fit the memory budget).

**SMO phase.** On the CPU, in float64, with every row of ``K`` in the cache, each column first takes the cheap
two-coordinate steps of LIBSVM (:mod:`joker_ext.smo`, compiled by numba) until its maximal violation is below
``SMO_TOL`` times its targets' scale, its sets (bounds, kink, free) have settled (``SMO_SETTLED``), or it has taken
``SMO_STEPS n`` steps. Those steps find the sets that the decomposition's factorisations otherwise pay for, 10-20
of them per subproblem while the sets are far from the solution's; the decomposition then certifies and finishes
from there, mostly in 1-5 outer iterations (hinge against SVC on five KEEL sets at n = 4000: 1.5-6.7x SVC's time
before, 0.8-2.5x with it). On a GPU, or with an LRU cache, the decomposition starts from the warm start (or zero); a
resumed fit goes on with the decomposition at once.

Every outer iteration:

1. **KKT check** from ``f = K alpha`` (kept up to date): each coordinate's optimality condition holds for
   the intercepts ``b`` in an interval ``[l_i, u_i]`` (:meth:`_Column.intercept_bounds`); ``alpha`` is
   optimal iff ``max_i l_i <= min_i u_i`` (without intercept: ``l_i <= 0 <= u_i``). The duality gap at
   ``(K alpha + b, alpha)`` with the best ``b`` is the stopping certificate.
2. **Working set** ``B``: the free coordinates and the worst violators, ``max(q, 2 |free|)`` in all but at
   most ``2 q`` at first (with an intercept, half with the largest ``l_i`` and half with the smallest ``u_i``: the
   maximal violating pairs of LIBSVM's WSS1). A subproblem that cannot hold every free coordinate makes
   the decomposition crawl, so the set grows with the free set; the cap keeps a transient free set (the
   coordinates a large proximal weight left on their way to a bound) from making subproblems of
   thousands of coordinates (hinge at n = 10^4: a 3,000-coordinate subproblem took 4.7 s). A free set that
   stays beyond the cap for ``CAP_PATIENCE`` outer iterations is the solution's own: the cap doubles. One that an
   exact subproblem solve left beyond it, at about the size it had before (``STABLE_FREE``), is the solution's own
   at once: the cap grows to hold it whole.
3. **Subproblem** on ``B`` with the others fixed: the same problem on ``K_BB`` with the linear term
   shifted by ``K_BN alpha_N`` and ``sum alpha_B`` kept. A set of mostly free coordinates (the problem
   restricted to its support vectors) is solved exactly by the interior-point method of
   :mod:`joker_ext.interior_point` (10 to 20 factorisations of ``|B|``, no proximal term; first active-set
   steps at the smallest weight from the current sets, which solve it whenever no step changes the sets of
   more coordinates than the step before, and are abandoned as soon as one does; the same steps are tried again
   from the interior point's iterate at a loose tolerance, ``PROBE_TOL``, and on large sets first at a looser one,
   ``EARLY_PROBE_TOL``) and snapped to its
   active sets by one active-set round at the smallest weight (float64; measured at n = 4000, C = 10,
   epsilon-insensitive: 13 outer iterations instead of 36, 1.0 s instead of 3.5 s). Where that snap fails, the
   interior point goes on to ``CROSSOVER_TOL`` and its iterate is snapped to the sets its distances to the bounds
   give (the *crossover*: weakly active coordinates stay about the square root of the complementarity inside their
   box, where the snap's prediction takes them for free); a column whose crossover finds its optimum degenerate
   (more such coordinates than half its free ones) sends every mostly free subproblem to the interior point from
   then on.
   Otherwise, or when that fails, the subproblem is solved by the proximal active-set rounds of
   :mod:`joker_ext.active_set` (each round decreases the whole objective, since its proximal term is
   centred at the current point), from the interior point's solution where it converged but its sets would not
   snap (degenerate coordinates: magic, 15,216 rows, hinge at gamma 0.5, threw six such solutions of 3,200
   coordinates away; 30.2 s at a gap of 6e-10 -> 27.2 s at 3.6e-14). The first active-set step frees only
   the ``FIRST_FREE`` worst violators of ``B`` (the others keep their bound: freeing every violator factored
   ``|B|`` coordinates, most of
   which the next step sent back to a bound); the next steps free what their predictions say. A set of
   mostly violators gets one settled round (the next working set brings other violators), a set of
   mostly free coordinates ``SUB_ROUNDS``. Rounds whose sets cycle raise the weight 3x; a weight at which they
   cycled is not tried again for a few subproblems (the floor falls 3x per subproblem). A round whose
   sets held at once is followed by one round at the smallest weight with the same sets: when they hold
   there too, that is the subproblem's exact solution (the last outer iterations then need no slow
   descent of the weight), else it is discarded. ``K_BB`` is evaluated from the points of ``B``
   (``|B|^2`` kernel values cost less than gathering them from scattered cached rows). The Cholesky factor of
   the free block (:class:`~joker_ext.free_factor.FreeFactor`) carries over from one mostly free subproblem to
   the next, the coordinates it holds joining ``B`` (``CARRY_RATIO``): near the solution consecutive free sets
   differ in a few coordinates, and the first step of a subproblem updates the factor instead of forming it
   (hinge and epsilon-insensitive, five problems, n = 10,000: 0.56-0.87x the time on the hard ones).
4. ``f += K_{:B} (alpha_B^new - alpha_B)`` with the kernel rows of the coordinates that moved (a
   sparse-times-dense product that reads them in place), kept in a cache of ``cache_columns`` rows: by
   default all ``n`` when ``n^2`` numbers fit half of the exact engines' default memory (``K`` is then
   formed lazily, row ``j`` when ``alpha_j`` first moves, and never evicted), else an LRU cache of
   ``4 q`` rows (LIBSVM keeps a kernel cache for the same reason). A coordinate that never moves (most
   violators that a subproblem leaves where they are) never has its row computed.

**Duplicate rows.** Rows with the same ``x`` and ``y`` are solved as one row of their summed weight
(:func:`~joker_ext.active_set.merge_duplicate_rows`): kept apart they make every free block that holds two of them
singular (magic, 68 duplicate pairs: 38.9 s -> 7.1 s).

**Stop.** At the relative gap ``tol``, or, when ``tol`` lies below the gap's rounding floor (the estimators'
default 1e-14 in float64), once every open column solved its last subproblem exactly at the smallest proximal
weight and the gap, below :data:`~joker_ext.defaults.ROUNDING_GAP`, has not halved for
:data:`~joker_ext.active_set.STALL_PATIENCE` iterations: nothing representable is left to gain (before this rule
such fits ran to ``max_iter``, 160 outer iterations where 36 reach the floor at n = 4000, C = 10). At once, below
that floor, when every open column's working set is the one its last subproblem solved exactly: nothing outside the
set has moved since, so the subproblem is the same and its solution is where the column stands (the 2-3 repeated
exact solves this saves were a fifth of an epsilon-insensitive fit at n = 4000). At large ``C`` the gap's own
rounding noise lies above that floor (``|alpha|`` up to ``C`` while ``f = K alpha`` stays of the order of the
targets): there, after :data:`~joker_ext.active_set.NOISE_PATIENCE` such iterations, the fit stops as 'stalled'
when the gap is within the noise that rounding ``f`` leaves (:class:`~joker_ext.active_set.GapStall`; absolute,
pinball and epsilon-insensitive at C = 1000-10^5 ran to ``max_iter`` with gaps of 1e-11 to 4e-9 that no longer
fell, e.g. absolute at n = 3000, C = 1000: 120 iterations and 5.5 s). Where the floor lies higher still (the free
block as ill-conditioned as the kernel's interpolant), two iterations after an exact solve of the whole problem that
no longer halve the gap stop the fit (:class:`_SolvedStall`).

Cost per outer iteration: ``|B|^2 d`` for ``K_BB``, ``n |moved| d`` for the moved rows not cached,
``n |moved|`` for the update, and a few Cholesky factorisations of the free part of ``K_BB``
(``|B|^3 / 3``). Memory: the cache, ``K_BB`` and the factor (kept per target column). Near the solution ``B``
holds every free coordinate and the last violators, and its subproblem is the whole problem restricted to the
support vectors.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .active_set import (SIGMA_FLOOR, SIGMA_START, GapStall, _Column, box_qp_inputs, merge_duplicate_rows, next_sigma,
                         outer_loop, supports_active_set)
from .box_sets import FREE
from .defaults import CONVERGENCE_WARN_GAP, FILL_ELEMENTS, WORKING_SET_DTYPE
from .dense import cholesky_shifted, prefault_, rows_product, scipy_blas_on_one_thread, submatrix
from .interior_point import solve_box_qp
from .free_factor import FreeFactor
from .engines import (Monitor, at_rounding_floor, register_solver, sigint_as_flag, target_level,
                      working_set_size as default_size)
from .losses import Loss
from .memory import is_out_of_memory, working_set_cache_rows
from .smo import smo_available, smo_columns
from .solver import SolverOptions, SolverResult

__all__ = ["working_set", "supports_working_set"]

#: Settled proximal rounds per subproblem.
SUB_ROUNDS = 3
#: Increases (by :data:`ESCALATE`) of the proximal weight a subproblem may make when its active sets cycle.
MAX_ESCALATIONS = 6
#: The working set holds at most this many times ``q`` coordinates.
MAX_SET_FACTOR = 2
#: Outer iterations in a row whose working set the cap cut before the cap doubles (10 kept problems whose free set
#: is a third to all of the support vectors at subproblems of half their free set for 10 iterations per doubling:
#: 3 took such fits (d = 20, n = 4000) to 0.68-0.87x of 10's time; with the quick steps' rule below as well, d = 20
#: fits took 0.22-0.44x their earlier time at n = 4000-10,000).
CAP_PATIENCE = 3
#: A free set beyond the cap that an exact subproblem solve left within this share of its size at the last outer
#: iteration is the solution's own: the cap grows at once to hold it whole. (Doubling at every cut after an exact
#: solve also took the free sets still growing by their violators into subproblems of thousands, which the interior
#: point solved: epsilon-insensitive at n = 10,000, d = 20, 1.33x the time.) Measured against three cuts per
#: doubling alone: absolute loss, n = 10,000, d = 50, gamma = 0.12, all 10,000 coordinates free at the end, 22.4 s ->
#: 12.4 s (it took three subproblems of 8,192 coordinates at each of the caps 16,384 and 32,768); pinball at
#: n = 10,000, C = 208, 23.2 s -> 14.8 s; hinge and epsilon-insensitive at gamma = 2 (n = 4000) 0.75x and 0.53x;
#: eleven hinge and epsilon-insensitive problems at gamma <= 0.5 within the noise (0.95x the time overall).
STABLE_FREE = 0.05
#: Where at least this share of the coordinates is free (most points are support vectors), the violators a working set
#: adds to its free coordinates come from the coordinates that are not free, ``MOSTLY_FREE_VIOLATORS`` times as many as
#: the free ones at most (at least ``q / 2``). The worst violators by the intercept bounds are mostly free coordinates
#: there, already in the set: after the SMO phase the working sets held the free set and a dozen others, and each exact
#: subproblem solve left new violators outside (mushroom at 4x scikit-learn's gamma, 3,374 of 4,000 free: five outer
#: iterations, the gap falling 15-300x each). Measured against the plain choice (n = 4000 unless said, best of three
#: alternating fits): mushroom (hinge) at 4x 'scale' 0.85x (5 -> 2 iterations); epsilon-insensitive on make_regression,
#: d = 8, 0.88x, d = 32, 0.98x, d = 32 at n = 10,000, 0.85x; on make_sparse_uncorrelated (C = 10, 38% free: now below
#: the share) 0.91x; hinge at d = 32 1.04-1.12x (n = 4000, C = 10; noise on this machine is 10-25%) and 1.04x (n =
#: 10,000). A quarter of the free ones instead of a tenth: sparse_uncorrelated 1.9x (its quick steps failed, the
#: interior point solved the subproblem). Below the share the choice is the plain one: where the quick steps fail, the
#: interior point pays for every coordinate added (at 9-16% free, spambase at 'scale' and flights, spambase took 1.5x
#: its time with these violators). The share was 40% until the quick steps solved spambase at 4x 'scale' (28% free),
#: which took 1.6x its time with the rule from a quarter on. A quarter against 40% (n = 4000 unless said, best of two
#: alternating fits, 29 problems): mushroom at 'scale' (27% free) 0.89x at C = 1 (4 -> 2 outer iterations), 1.00x at
#: C = 10 and 100 (5 -> 4); spambase at 4x 'scale' 0.92x and 0.99x (C = 1, 10), at C = 100 0.88x; the others (hinge,
#: epsilon-insensitive, squared hinge; sparse_uncorrelated; magic and letter at n = 10,000) 0.89-1.07x, the noise.
MOSTLY_FREE_SHARE = 0.25
MOSTLY_FREE_VIOLATORS = 0.1
#: Where an exact subproblem freed at least this share of the coordinates its working set took besides the free ones,
#: the column's next working set takes twice the share of violators (up to ``MAX_VIOLATORS |free|``), and its cap
#: grows to hold the free set whole (a free set that grows so is no transient one); else the share falls back to
#: ``MOSTLY_FREE_VIOLATORS``. Near interpolation most violators taken end free (70-95%), and a tenth more per outer
#: iteration took 13 iterations from the SMO phase's 2,889 free coordinates to 8,875 of 10,000 (pinball, C = 31).
#: Measured (best of two alternating fits, with :class:`_SolvedStall`): that fit 42 s -> 13.6 s (6 iterations);
#: absolute at n = 10,000 0.85x and 0.94x, at n = 4000, C = 764, 0.93x; pinball at n = 4000, C = 28, 0.59x; eleven
#: other survey cases (hinge, epsilon-insensitive, pinball) the same iterations, within the noise.
GROWTH_FREED = 0.5
MAX_VIOLATORS = 1.0
#: Factor by which the smallest proximal weight a column's subproblems may take (raised by a cycle) falls per subproblem.
FLOOR_DECAY = 3.0
#: Proximal weight (times the kernel's diagonal) at which a cycling subproblem falls back to projected Newton.
SIGMA_CEILING = 10.0
#: Factor by which a subproblem raises its proximal weight when its active sets cycle (or stall: :data:`STALL`).
#: 10 instead of 3, with :data:`STALL`: make_moons (n = 4000, hinge) at C = 10 and 10x 'scale', whose rounds at
#: proximal weights 1e-8 to 7e-6 each ran 15 steps without settling before one at 2e-5 did, 0.81x the fit's time;
#: make_circles at C = 1000 and 10x 'scale' 0.87x; make_moons at C = 1000 0.98x; 22 other problems (hinge,
#: epsilon-insensitive, absolute and pinball, n = 4000) the same iterates.
ESCALATE = 10.0
#: A subproblem's proximal round is abandoned (and the weight escalated) once a step from the fifth on still changes
#: the sets of more than this share of the coordinates its first step changed (:meth:`_Column.round`'s ``stall``).
STALL = 0.75
#: Subproblems of a column whose interior-point solution would not snap to its active sets (degenerate coordinates)
#: this many times go straight to the proximal rounds: the interior point then took 14-18 ms of a 200-coordinate
#: subproblem that the rounds from the same start solve in 3-6 ms (make_circles, C = 1000, 10x 'scale': 0.85x the
#: fit's time; make_moons at C = 10, 10x 'scale', 0.97x; the rest unchanged).
SNAP_FAILURES = 1
#: Relative complementarity of the interior-point subproblem solves (their answer is snapped to its active sets
#: afterwards, so it need not be tight: 1e-8 instead of 1e-11 saved 2-6% of epsilon-insensitive and hinge fits).
INTERIOR_POINT_TOL = 1e-8
#: The crossover (:func:`_crossover`): whether an interior-point solution that would not snap to the sets its
#: prediction gives goes on to ``CROSSOVER_TOL`` and is snapped to the sets by distance (within ``CROSSOVER_SHARE`` of
#: its box's width from a bound: :meth:`~joker_ext.active_set._Column.near_sets`). Where the margin points' kernel
#: block is numerically of low rank the optimum is degenerate: many coordinates sit at a bound with no pull off it,
#: the interior point leaves them about the square root of its complementarity inside their box (1e-7 to 1e-4 of the
#: width at 1e-12; the free ones mostly beyond 1e-3), the prediction takes them for free, and the proximal rounds that
#: followed kept about 1,000 such coordinates free and crawled (the survey's case 1035, magic with its columns
#: rescaled, hinge at 0.03x 'scale': 'stalled' at relative gaps of 1e-7 to 1e-6 after 1.5-11 s); snapped by
#: distance, the free sets are 200-250 (LIBSVM's count at its tol 1e-9) and the fits converge. Where the crossover's
#: active-set steps do not settle (a weakly active coordinate flipping between its bound and free on rounding), the
#: iterate at ``CROSSOVER_TOL`` is taken as the subproblem's solution (with the proximal rounds from it instead, C = 16
#: and 0.1x 'scale' took 40 outer iterations and stopped 'stalled' at 1e-10; taken, 10 and converged at 2e-12). The
#: interior point goes on from its iterate at ``INTERIOR_POINT_TOL`` (2-7 more iterations, 27 once on a degenerate set
#: of 1,100), not afresh: a second solve cost make_moons at C = 1000 and 10x 'scale' 1.5x its time. 1e-12 against
#: 1e-10 / 1e-11 / 1e-13 and 1e-3 against 3e-3 / 3e-4 on case 1035 at three (C, gamma): the fewest outer iterations.
CROSSOVER = True
CROSSOVER_TOL = 1e-12
CROSSOVER_SHARE = 1e-3
#: The crossover's verdict: a column's optimum is *degenerate* when more than ``DEGENERATE_SHARE`` times as many
#: coordinates as it leaves free lie between ``DEGENERATE_DISTANCE`` and ``CROSSOVER_SHARE`` of their box's width from
#: a bound (case 1035 at 0.03x 'scale': 355-913 against 110-235 free; make_circles at C = 1000 and 10x 'scale', whose
#: first solution would not snap either: 4 against 198). Every mostly free subproblem of a degenerate column then goes
#: to the interior point and the crossover: the proximal rounds between them freed the degenerate coordinates again
#: (14.6 s at C = 1, 0.03x 'scale', against 1.2 s). The other columns keep :data:`SNAP_FAILURES`, where the rounds cost
#: less than an interior point (make_circles at C = 1000: 10-20 ms against 50-60 ms a subproblem). At 0.5 rather than
#: 2, case 1035 at C = 1 and 0.1x 'scale' (201 against 215) converges in 13 outer iterations instead of stopping
#: 'stalled' at 1.3e-9 after 35; it costs 1.1-1.25x on two problems the rounds solve well (case 1035 at 0.3x 'scale',
#: 341 against 345; make_moons at C = 1000, 135 against 154), both still faster than SVC.
DEGENERATE_DISTANCE = 1e-7
DEGENERATE_SHARE = 0.5
#: A subproblem of mostly free coordinates first takes active-set steps at the smallest proximal weight from its
#: current sets, while no step changes the sets of more than this many times as many coordinates as the step before
#: (:meth:`joker_ext.active_set._Column.round`'s ``shrink``); the interior point solves it when they stop. Steps that
#: settle shrink their changes (236, 80, 20, 4, 0 coordinates at |B| = 1732); steps that do not settle grow them
#: again (191, 220, ...; 1177, 830, 990). It replaced a fixed 3 steps, which abandoned many settling rounds for a
#: 10-factorisation interior-point solve (epsilon-insensitive at n = 4000: 0.44-0.96x the time on five problems,
#: hinge 0.40-1.05x); 1 rather than 0.8 (which also stopped rounds going 467, 379, ...) took hinge at gamma = 0.5 to
#: 0.75x (n = 4000) and 0.88x (n = 10,000), the other problems within 1%.
QUICK_SHRINK = 1.0
#: The same rule for the first subproblem after the SMO phase (near the solution: :func:`_subproblem`'s ``near``), whose
#: quick steps may change four times as many coordinates as the step before: spambase (hinge at 4x 'scale', C = 1 and
#: 10) stopped them after two steps and went to the interior point: 0.285 -> 0.145 s and 0.39 -> 0.18 s; the other
#: problems of a 19-problem panel (hinge, epsilon-insensitive, squared hinge, Huber) within the noise (no limit did
#: as well; 2 only the first spambase fit). Everywhere (2 for every subproblem) it made epsilon-insensitive on
#: flights at C = 10 1.1x slower.
QUICK_SHRINK_NEAR = 4.0
#: When the interior point's relative complementarity first reaches this, the same quick steps try to finish the
#: subproblem from the sets its iterate predicts; the interior point goes on only when they stop (hinge,
#: n = 10,000, gamma = 0.5, whose subproblems of 1,700-2,600 coordinates went to the interior point: 0.71x the time;
#: the other grid problems within 4%).
PROBE_TOL = 1e-4
#: Subproblems of at least ``EARLY_PROBE_SIZE`` coordinates try the quick steps at ``EARLY_PROBE_TOL`` first, and at
#: ``PROBE_TOL`` again when they fail there: each interior-point iteration factors the whole set (0.09 s at 3,000
#: coordinates), and the quick steps often finish from the sets of an iterate at 1e-2. Measured against
#: ``PROBE_TOL`` alone (two alternating fits, best of each): epsilon-insensitive, n = 10,000, gamma = 0.5, 3.65 ->
#: 2.60 s; hinge, n = 10,000, C = 10, gamma = 0.5, 4.04 -> 2.69 s; eight hinge and epsilon-insensitive problems
#: with smaller subproblems within 3%. The absolute and pinball losses at d = 3 took 1.13-1.33x their time (three
#: problems, n = 4000-10,000: their early probes succeeded, but on other exact solutions of degenerate subproblems,
#: and the fits took one more outer iteration); absolute at n = 10,000, d = 50, 0.81x. 1e-3 instead of 1e-2 kept the
#: first hinge/epsilon-insensitive problem at 3.7 s; probing at 1e-2 first whatever the size made small subproblems
#: up to 1.3x slower (a failed probe costs a quick-step attempt).
EARLY_PROBE_TOL = 1e-2
EARLY_PROBE_SIZE = 1024
#: After a column's quick steps fail ``QUICK_FAILURES`` times in a row, the last time at its relative gap ``g``, its
#: mostly-free subproblems go straight to the interior point until the column's gap falls below
#: ``g / QUICK_RETRY_DROP``: far from the solution each working set brings hundreds of new violators and the quick
#: steps fail again (epsilon-insensitive, n = 10,000, C = 10: five failures in a row at gaps 0.68 to 0.02, 4.7 s of
#: a 21 s fit). One failure is not enough: the quick steps often fail once and then succeed (skipping after one
#: failure made epsilon-insensitive at n = 4000, C = 10, 1.2x slower).
QUICK_FAILURES = 2
QUICK_RETRY_DROP = 10.0
#: The quick steps' first step changes the sets of at most this fraction of the free coordinates (``FIRST_FREE`` at
#: least): the worst violators; the others keep theirs, and the next steps' predictions bring those that must move
#: (freeing every violator factored the whole working set, and the next step sent most of them back to a bound).
#: Measured against no limit at n = 4000, five problems, three seeds: 0.97x the time (geometric mean).
QUICK_FIRST = 0.125
#: A column's free-block factor carries over to its next subproblem when that subproblem is mostly free and at most
#: ``1 / CARRY_RATIO`` of the factor's coordinates lie outside its working set (they join the set; a larger share
#: made subproblems of transient free sets large enough to need the interior point).
CARRY_RATIO = 8
#: The first step of a subproblem frees at most this many violators (times ``max(1, |free| / FIRST_FREE)``).
FIRST_FREE = 64
#: The SMO phase (:mod:`joker_ext.smo`) stops at this maximal violation of the optimality conditions, relative to
#: the largest ``|lin_i|`` (the targets' scale); the decomposition finishes from there.
SMO_TOL = 1e-3
#: The SMO phase takes at most this many steps per coordinate (then the decomposition goes on from its point).
SMO_STEPS = 5.0
#: The SMO phase ends once a round of its steps changes the sets of fewer coordinates than this share of its steps.
#: At large ``C`` a round of 1,000 steps often changes fewer than 50 sets while the free set still churns inside: the
#: first subproblem's active-set steps then swing it by 100 coordinates a step and fall back to the interior point.
#: Measured against 0.05 (hinge and epsilon-insensitive, n = 4000, best of two alternating fits, 27 problems):
#: spambase at C = 10 / 100 / 1000 0.58-0.62x / 0.45x / 0.75-0.84x, banana at C = 100 0.81x, flights
#: epsilon-insensitive at C = 10 0.78-0.84x; magic and phoneme at C = 100 1.09-1.12x, 1.02-1.05x on the smooth
#: regressions; geometric mean 0.94x. At n = 10,000 (12 problems) 0.95-1.06x, magic at C = 100 1.11x.
SMO_SETTLED = 0.01
#: Whether the decomposition takes the SMO phase's free sets whole into its first working sets.
SMO_FREE_FOUND = True
#: Whether fits on the CPU with every kernel row in the cache start with the SMO phase.
USE_SMO = True
#: Where the cache keeps every row, a working set of at least this share of the coordinates is widened to all of
#: them: its block ``K_BB`` is then the cache's buffer itself, with no copy (a gathered block of 3,714 or 3,979 of
#: 4,000 coordinates cost 60-70 ms, page faults included). Measured (n = 4000, best of 2-3 alternating fits):
#: mushroom at 4x 'scale' 0.82-0.95x, make_classification d = 32 at gamma 0.125, C = 10, 0.86-0.89x, the other
#: problems of the panel within the noise; 0.6 was no better.
WHOLE_SHARE = 0.8
#: Iterations in a row without the gap halving after an exact solve of the whole problem before the working set stops
#: (:class:`_SolvedStall`); a working set that repeats the last one is solved every second time, so two iterations
#: hold one more solve.
SOLVED_PATIENCE = 2
#: The first working set after the SMO phase takes at most ``NEAR_RATIO`` times as many violators and fillers besides
#: its free coordinates as there are coordinates that violate their optimality conditions (free ones included), or
#: ``NEAR_FILL`` if that is more (:func:`_select`'s ``near``): on letter, penbased and optdigits 1-2 coordinates
#: outside the free set violate, and the 250-300 fillers of ``q = 512`` made the block and its exact solve three times
#: larger. Measured (hinge, n = 4000, alternating fits): the easy KEEL sets 0.9-0.97x, phoneme 0.92x (4 -> 1 outer
#: iterations), 16 other problems (hinge, epsilon-insensitive, squared hinge, Huber) within the noise.
NEAR_FILL = 32
NEAR_RATIO = 2.0


def supports_working_set(loss: Loss) -> bool:
    """A conjugate that is linear or quadratic on its box (``loss.quadratic``)."""
    return supports_active_set(loss)


class _ColumnCache:
    """Rows ``K(x_j, X)`` of the kernel matrix (its columns, by symmetry), computed on demand and kept for the
    ``capacity`` most recently used ``j``; stored as rows, so that a set of them is read contiguously.
    With ``capacity >= n`` nothing is ever evicted and row ``j`` lives in row ``j`` of the buffer: ``K`` is
    formed lazily, one row per coordinate that enters a working set."""

    def __init__(self, operator, capacity: int, dtype, device):
        n = operator.n
        self.operator, self.capacity = operator, max(1, min(int(capacity), n))
        self.full = self.capacity == n
        self.buffer = torch.empty(self.capacity, n, dtype=dtype, device=device)
        self.chunk = max(1, FILL_ELEMENTS // n)  # rows per kernel evaluation (bounded temporary block)
        if self.full:
            self.have = torch.zeros(n, dtype=torch.bool, device=device)
        else:
            self.slot = torch.full((n,), -1, dtype=torch.long, device=device)
            self.owner = torch.full((self.capacity,), -1, dtype=torch.long, device=device)
            self.last_used = torch.full((self.capacity,), -1, dtype=torch.long, device=device)
            self.clock = 0
            self.filled = 0  # slots 0 .. filled-1 hold a row (the others are used before any eviction)
        self.X = operator.data.all().to(dtype=dtype, device=device)
        self.rows = operator.kernel.against(self.X)  # K(X1, X): the kernel's evaluation prepared on X

    def _fill(self, slots: torch.Tensor, idx: torch.Tensor) -> None:
        for s in range(0, idx.numel(), self.chunk):
            self.buffer.index_copy_(0, slots[s:s + self.chunk], self.rows(self.X[idx[s:s + self.chunk]]))

    def __call__(self, idx: torch.Tensor):
        """``(R, rows)`` with ``R[rows] = K[idx, :]`` for unique ``idx``: ``R`` is the cache's buffer, or a fresh
        block (``rows = arange``) when ``idx`` holds more than ``capacity`` coordinates. The rows stay valid
        until the next call."""
        if idx.numel() > self.capacity:
            return self.rows(self.X[idx]), torch.arange(idx.numel(), device=idx.device)
        if self.full:
            missing = idx[~self.have[idx]]
            if missing.numel():
                self._fill(missing, missing)
                self.have[missing] = True
            return self.buffer, idx
        self.clock += 1
        missing = idx[self.slot[idx] < 0]
        if missing.numel():
            m = missing.numel()
            fresh = min(m, self.capacity - self.filled)
            slots = torch.arange(self.filled, self.filled + fresh, device=idx.device)
            self.filled += fresh
            if fresh < m:  # evict the least recently used rows not in idx
                in_use = torch.zeros(self.capacity, dtype=torch.bool, device=idx.device)
                have = self.slot[idx]
                in_use[have[have >= 0]] = True
                in_use[slots] = True
                age = torch.where(in_use, torch.full_like(self.last_used, self.clock), self.last_used)
                old_slots = torch.argsort(age)[: m - fresh]
                old = self.owner[old_slots]
                self.slot[old[old >= 0]] = -1
                slots = torch.cat([slots, old_slots])
            self._fill(slots, missing)
            self.owner[slots] = missing
            self.slot[missing] = slots
        rows = self.slot[idx]
        self.last_used[rows] = self.clock
        return self.buffer, rows


def _free(col: _Column, a, idx: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Which coordinates (of ``idx``, all by default) are free: strictly inside the box and off the kink."""
    a, lo, hi = (a, col.lo, col.hi) if idx is None else (a[idx], col.lo[idx], col.hi[idx])
    return (a > lo) & (a < hi) & (a != 0)


def _select(col: _Column, a, bounds, q: int, intercept: bool, b: float = 0.0, cap: Optional[int] = None,
            is_free: Optional[torch.Tensor] = None, near: bool = False,
            violator_share: float = MOSTLY_FREE_VIOLATORS):
    """The working set (sorted): the free coordinates (``lo < a_i < hi``, ``a_i != 0``) and the worst violators
    of the optimality conditions, at least as many as free ones, so that the set grows to ``2 |free|``
    when the free coordinates outnumber ``q / 2`` (a decomposition whose subproblems cannot hold the free
    set crawls) - but to ``cap`` (``MAX_SET_FACTOR q`` unless given) at most: beyond, the free coordinates farthest from their
    optimality at the intercept ``b`` are taken (a large transient free set, of coordinates on their way
    to a bound, made subproblems of thousands of coordinates). Where at least ``MOSTLY_FREE_SHARE`` of all
    coordinates are free, the violators come from the others, ``violator_share |free|`` of them at most (at least
    ``q / 2``; the share grows where they end free: :data:`GROWTH_FREED`). ``bounds``:
    :meth:`_Column.intercept_bounds` at ``a`` (the cap cuts the free coordinates where twice their number exceeds
    it); ``is_free``: :func:`_free` at ``a`` when the caller has it. ``near``: ``a`` is near the solution (the SMO
    phase's point), where the violators and fillers chosen besides the free set number at most ``NEAR_RATIO`` times
    the coordinates that violate their conditions at ``b`` (free ones included), or ``NEAR_FILL`` if that is more."""
    lower, upper = bounds
    n = a.numel()
    is_free = _free(col, a) if is_free is None else is_free
    free = torch.nonzero(is_free).reshape(-1)
    many_free = free.numel() >= MOSTLY_FREE_SHARE * n  # (of all coordinates; not the working set's share)
    cap = MAX_SET_FACTOR * q if cap is None else cap
    if 2 * free.numel() > cap:  # a free coordinate is optimal at b = lower = upper
        free = free[torch.topk((lower[free] - b).abs(), cap // 2).indices]
    budget = min(n, max(q, 2 * free.numel())) - free.numel()
    if many_free:  # the violators from the coordinates that are not free
        budget = min(budget, max(q // 2, int(violator_share * free.numel())))
        lower, upper = lower.masked_fill(is_free, -math.inf), upper.masked_fill(is_free, math.inf)
    if near:
        violators = int(_violating(lower, upper, b).sum())
        budget = min(budget, max(NEAR_FILL, int(NEAR_RATIO * violators)))
    if intercept:
        half = max(1, budget // 2)
        up = torch.topk(lower, min(half, n)).indices
        down = torch.topk(-upper, min(half, n)).indices
        chosen = torch.cat([up, down])
    else:
        violation = torch.maximum(lower, -upper).clamp_min(0)
        chosen = torch.topk(violation, min(max(1, budget), n)).indices
    return torch.unique(torch.cat([free, chosen]))


def _violating(lower: torch.Tensor, upper: torch.Tensor, b: float) -> torch.Tensor:
    """Which coordinates violate their optimality condition at the intercept ``b``: ``b`` outside their interval
    ``[lower, upper]`` (:meth:`_Column.intercept_bounds`)."""
    return (lower > b) | (upper < b)


def _violates(idx: torch.Tensor, bounds, b: float) -> bool:
    """Whether a coordinate of ``idx`` violates its optimality condition at the intercept ``b``: ``b`` outside its
    interval ``[lower, upper]`` (:meth:`_Column.intercept_bounds`). A working set that adds only coordinates which do
    not, to one whose subproblem was solved exactly, poses the same subproblem again (its fillers, the next-worst
    coordinates, change with rounding: optdigits at C = 10 solved it a second time at a gap of 1.9e-14)."""
    lower, upper = bounds
    return bool(_violating(lower[idx], upper[idx], b).any())


def _violates_outside(B: torch.Tensor, bounds, b: float) -> bool:
    """:func:`_violates` for the coordinates outside ``B``: after an exact solve of ``B``'s subproblem, none violates
    only when ``B``'s solution is the whole problem's, and every later working set then adds only coordinates that do
    not violate (the next subproblem would repeat this one)."""
    outside = torch.ones(bounds[0].numel(), dtype=torch.bool, device=B.device)
    outside[B] = False
    return _violates(torch.nonzero(outside).reshape(-1), bounds, b)


def _best_intercept(bounds, b_sub: float) -> float:
    """An intercept for the certificate from ``bounds = (l, u)`` (:meth:`_Column.intercept_bounds`): the
    middle of ``[max l, min u]`` when it is not empty, else the subproblem's multiplier clipped into the
    spread of the bounds."""
    lower, upper = bounds
    lo, hi = float(lower.max()), float(upper.min())  # (-inf and inf where no bound is finite)
    if lo <= hi:
        if math.isinf(lo) and math.isinf(hi):
            return b_sub
        return hi if math.isinf(lo) else lo if math.isinf(hi) else 0.5 * (lo + hi)
    return min(max(b_sub, hi), lo)


def _first_sets(sub: _Column, a, f, b: float, sigma: float, keep: Optional[int] = None):
    """The sets of a subproblem's first active-set step: the prox-gradient prediction at ``a``, except that of
    the coordinates it would move off their current status only the ``keep`` worst violators do (by default
    ``FIRST_FREE`` times ``max(1, |free| / FIRST_FREE)``; the others keep theirs). Freeing every violator of ``B``
    at once factors ``|B|`` coordinates, most of which the next steps send back to a bound."""
    s = sigma / sub.c
    pred = sub.predict(a, f, b, s, a)
    cur = sub.status(a)
    changed = (pred[0] != cur[0]) | (pred[1] != cur[1])
    free = int((cur[0] == FREE).sum())
    if keep is None:
        keep = FIRST_FREE * max(1, free // FIRST_FREE)
    idx = torch.nonzero(changed).reshape(-1)
    if idx.numel() <= keep:
        return pred
    lower, upper = sub.intercept_bounds(a, f + sub.h * a - sub.lin)
    violation = torch.maximum(lower - b, b - upper)[idx]
    stay = idx[torch.argsort(violation, descending=True)[keep:]]
    code, sgn, value = (t.clone() for t in pred)
    code[stay], sgn[stay], value[stay] = cur[0][stay], cur[1][stay], cur[2][stay]
    return code, sgn, value


def _round_at_floor(sub: _Column, a, f, b: float, scale: float, shrink: Optional[float] = None,
                    keep: Optional[int] = None):
    """The subproblem's exact solution ``(a_B, b)`` by active-set steps at the smallest proximal weight from the sets
    predicted at ``(a, f = K_BB a, b)``; None when they do not settle within ``MAX_INNER`` steps (or, with ``shrink``,
    as soon as a step changes more than ``shrink`` times as many sets as the step before: :meth:`_Column.round`).
    With ``keep``, the first step moves only that many violators off their current sets (:func:`_first_sets`)."""
    s = SIGMA_FLOOR * scale / sub.c
    sets = sub.predict(a, f, b, s, a) if keep is None else _first_sets(sub, a, f, b, SIGMA_FLOOR * scale, keep)
    out = sub.round(a, f, b, a.clone(), s, *sets, shrink=shrink)
    return None if out is None else (out[0], out[2])


def _interior_point(sub: _Column, K_BB, scale: float):
    """``(a_B, b, exact, snap_failed, degenerate)``: the subproblem's exact solution by
    :func:`~joker_ext.interior_point.solve_box_qp` (no proximal term), finished by the quick steps from its iterate
    at ``PROBE_TOL`` or snapped to its active sets by :func:`_round_at_floor` at ``INTERIOR_POINT_TOL`` (``exact``
    True). Where that snap fails (``snap_failed``) the interior point goes on to :data:`CROSSOVER_TOL` and its iterate
    is snapped to the sets by distance (:func:`_crossover`; ``degenerate``: its verdict), or, where that does not
    settle, is the solution itself (``exact`` True: the subproblem solved to ``CROSSOVER_TOL``); where it stops short
    of ``CROSSOVER_TOL``, the caller's proximal rounds start from its iterate at ``INTERIOR_POINT_TOL`` (``exact``
    False). None when the interior point did not reach ``INTERIOR_POINT_TOL``."""
    Q = K_BB.clone()
    Q.diagonal().add_(sub.h)
    snapped, loose = [], []

    def probe(a, b, level):
        if level > INTERIOR_POINT_TOL:  # the quick steps, abandoned as soon as they stop settling
            out = _round_at_floor(sub, a, K_BB @ a, b, scale, QUICK_SHRINK)
        else:
            loose.append((a, b))
            out = _round_at_floor(sub, a, K_BB @ a, b, scale)
        if out is not None:
            snapped.append(out)
        return out is not None

    levels = (EARLY_PROBE_TOL, PROBE_TOL) if K_BB.shape[0] >= EARLY_PROBE_SIZE else (PROBE_TOL,)
    a, b, _, converged = solve_box_qp(Q, sub.lin, sub.kink, sub.lo, sub.hi, sub.total if sub.intercept else None,
                                      tol=CROSSOVER_TOL if CROSSOVER else INTERIOR_POINT_TOL, probe=probe,
                                      probe_tol=levels + (INTERIOR_POINT_TOL,))
    del Q
    if snapped:
        return snapped[0] + (True, False, False)
    if not loose:
        return None
    if not (CROSSOVER and converged):  # (short of CROSSOVER_TOL) the rounds start from the iterate that would not snap
        return loose[0] + (False, True, False)
    # where the crossover's steps do not settle (weakly active coordinates that flip between a bound and free on
    # rounding), the iterate at CROSSOVER_TOL is the subproblem's solution to that tolerance
    out, degenerate = _crossover(sub, K_BB, a, b, scale)
    return (out or (a, b)) + (True, True, degenerate)


def _crossover(sub: _Column, K_BB, a, b: float, scale: float):
    """``(solution, degenerate)``: the subproblem's exact solution ``(a_B, b)`` by active-set steps at the smallest
    proximal weight from the sets by distance (:meth:`~joker_ext.active_set._Column.near_sets`) of its interior-point
    solution ``(a, b)`` at :data:`CROSSOVER_TOL`, or None where the steps do not settle; ``degenerate``: whether more
    than ``DEGENERATE_SHARE`` times as many coordinates as that leaves free lie between ``DEGENERATE_DISTANCE`` and
    ``CROSSOVER_SHARE`` of their box's width from a bound."""
    code, sgn, value = sub.near_sets(a, CROSSOVER_SHARE)
    free = int((code == FREE).sum())
    degenerate = int((sub.near_sets(a, DEGENERATE_DISTANCE)[0] == FREE).sum()) - free > DEGENERATE_SHARE * free
    out = sub.round(a, K_BB @ a, b, a.clone(), SIGMA_FLOOR * scale / sub.c, code, sgn, value)
    return (None if out is None else (out[0], out[2])), degenerate


def _subproblem(col: _Column, K_BB, B, a, f, b: float, sigma: float, floor: float, factor: FreeFactor,
                mostly_free: bool, quick: bool = True, near: bool = False, interior: bool = True):
    """Proximal active-set rounds on the block ``B`` (``K_BB`` its kernel block; ``factor`` the column's free-block
    factor, numbered as ``B``; ``mostly_free``: whether free coordinates make at least half of the working set that
    :func:`_select` chose; ``quick``: whether a mostly free set first tries the quick steps from its current sets;
    ``near``: whether ``a_B`` starts near the subproblem's solution, the first subproblem after the SMO phase, where a
    set of mostly violators tries the quick steps too); returns the new ``a_B``, the subproblem's intercept, the next
    proximal weight, the floor, whether ``a_B`` is the subproblem's exact solution (a round at the smallest weight
    whose sets held at once), whether a mostly free set's quick steps were tried and failed, whether its
    interior-point solution would not snap to its active sets, and whether the crossover then found the optimum
    degenerate (:func:`_crossover`). ``interior``: whether a mostly free set may go to the interior point
    (:data:`SNAP_FAILURES`, :data:`DEGENERATE_SHARE`)."""
    aB = a[B]
    fB = K_BB @ aB
    sub = _Column(K_BB, K_BB.diagonal().clone(), col.loss, col.y[B], col.c[B], col.intercept,
                  offset=f[B] - fB, total=float(aB.sum()), factor=factor)
    # a set of mostly violators gets one settled round (the next working set brings other violators); a set
    # of mostly free coordinates is the problem restricted to its support vectors: solved exactly by the
    # interior-point method (float64: its tolerances are float64's), else (when it fails, or once the column's interior
    # point failed to snap: ``interior`` False) by SUB_ROUNDS rounds
    free = int(_free(col, a, B).sum())
    float64 = K_BB.dtype == torch.float64
    if float64 and (mostly_free and quick or near):
        # near the solution the sets change little from one subproblem to the next: a few active-set steps from
        # the current sets (one factor update each) solve it; else a mostly free set goes to the interior point, a
        # set of mostly violators to the rounds. (Mostly violators are tried only right after the SMO phase: hinge
        # at n = 4000, letter, penbased, satimage, texture, optdigits at C = 10, 2-3 -> 1 outer iterations, 0.81-0.96x
        # the time; a proximal round moved them part of the way, and the exact solve came one iteration later.)
        first = max(FIRST_FREE, int(QUICK_FIRST * free))
        done = _round_at_floor(sub, aB, fB, b, col.scale, QUICK_SHRINK_NEAR if near else QUICK_SHRINK, first)
        if done is not None:
            return done[0], done[1], sigma, floor, True, False, False, False
    quick_failed = float64 and mostly_free and quick
    snap_failed = degenerate = False
    if mostly_free and float64 and interior:
        solved = _interior_point(sub, K_BB, col.scale)
        if solved is not None:
            snap_failed, degenerate = solved[3], solved[4]
            if solved[2]:
                return solved[0], solved[1], sigma, floor, True, quick_failed, snap_failed, degenerate
            # its active sets would not snap and it stopped short of CROSSOVER_TOL: the rounds start from its iterate
            aB, b = solved[0], solved[1]
            fB = K_BB @ aB
    sets, settled, exact = _first_sets(sub, aB, fB, b, sigma), 0, False
    rounds = SUB_ROUNDS if mostly_free else 1
    for _ in range(SUB_ROUNDS + MAX_ESCALATIONS):
        out = sub.round(aB, fB, b, aB.clone(), sigma / sub.c, *(sets or (None, None, None)), stall=STALL)
        if out is None:  # the sets cycle: a more diagonal round, same centre (cheap next to a fallback)
            if sigma >= SIGMA_CEILING * col.scale:  # diagonal enough and still cycling: monotone fallback
                aB, fB, b = sub.newton_round(aB.clone(), fB.clone(), sigma / sub.c, aB.clone())
                break
            sigma, sets = sigma * ESCALATE, None
            floor = sigma  # within this subproblem, no smaller weight than one that settled after a cycle
            continue
        aB, fB, b, steps, sets = out
        settled += 1
        exact = steps <= 1 and sigma <= SIGMA_FLOOR * col.scale
        sigma = next_sigma(sigma, steps, floor)
        if steps <= 1 and sigma > SIGMA_FLOOR * col.scale:
            # sets that held at once are likely the subproblem's own: one round at the smallest weight
            # with them is the exact solution when they hold there too (else that round is discarded)
            fin = sub.round(aB, fB, b, aB.clone(), SIGMA_FLOOR * col.scale / sub.c, *sets)
            if fin is not None and fin[3] <= 1:
                aB, fB, b, _, sets = fin
                exact = True
        if steps <= 1 or settled == rounds:
            break
    # the next subproblem starts near what settled here
    return aB, b, max(sigma, floor / 10.0), floor, exact, quick_failed, snap_failed, degenerate


class _KernelRows:
    """The kernel matrix read through the cache: blocks ``K_BB`` and products ``K[:, S] v``."""

    def __init__(self, cache: _ColumnCache):
        self.cache = cache
        self.n = cache.X.shape[0]
        self._B = None
        self._block = torch.empty(0, dtype=cache.buffer.dtype, device=cache.buffer.device)
        self._touched = 0  # the entries of _block whose pages prefault_ has mapped

    def block(self, B: torch.Tensor) -> torch.Tensor:
        """``K_BB``, valid until the next call: gathered from the cached rows when the cache keeps every row and
        holds those of ``B`` (forming the missing ones when that costs at most a quarter of evaluating the block),
        into memory kept from one call to the next, or the cache's buffer itself when ``B`` holds every point; else
        evaluated from the points of ``B``. (A fresh block of 3,714^2 numbers cost 30 ms of page faults on mushroom
        at n = 4,000, a third of its evaluation at d = 98.)"""
        self._B = B
        m = B.numel()
        if self.cache.full:
            missing = B[~self.cache.have[B]]
            if 4 * missing.numel() * self.n <= m * m:
                self.cache(missing)
                if m == self.n:
                    return self.cache.buffer
                if self._block.numel() < m * m:  # room for sets a quarter larger (pages are touched as used)
                    side = min(self.n, m + m // 4)
                    self._block = torch.empty(0, dtype=self._block.dtype, device=self._block.device)  # freed first
                    self._block = torch.empty(side * side, dtype=self._block.dtype, device=self._block.device)
                    self._touched = 0
                if m * m > self._touched:  # pages the gather would map one by one
                    prefault_(self._block[self._touched:m * m])
                    self._touched = m * m
                return submatrix(self.cache.buffer, B, out=self._block[:m * m].view(m, m))
        XB = self.cache.X[B]
        return self.cache.operator.kernel(XB, XB)

    def update(self, sel: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """``K[:, B[sel]] delta`` for the ``B`` of the last :meth:`block`, through the cached rows."""
        R, rows = self.cache(self._B[sel])
        return rows_product(R, rows, delta.unsqueeze(1)).reshape(-1)

    def matmul(self, A: torch.Tensor) -> torch.Tensor:
        """``K A`` through the rows of the nonzero rows of ``A``, ``capacity`` at a time."""
        idx = torch.nonzero((A != 0).any(1)).reshape(-1)
        out = torch.zeros(self.n, A.shape[1], dtype=A.dtype, device=A.device)
        step = self.cache.capacity
        for s in range(0, idx.numel(), step):
            R, rows = self.cache(idx[s:s + step])
            out += rows_product(R, rows, A[idx[s:s + step]])
        return out


def _decompose(src: _KernelRows, columns, loss: Loss, Y, c_col, alpha, F, intercept: bool, q: int, mon: Monitor,
               opts: SolverOptions, it: int, state: dict, interrupted=lambda: False, level=None,
               free_found: bool = False):
    """The outer loop of the decomposition from ``(alpha, F = K alpha)``, in place (``Y`` less ``level``:
    :func:`~joker_ext.engines.target_level`; ``columns``: each target column's :class:`_Column`, without ``K``);
    returns ``(reason, it, rec)``. ``free_found``: the start's free sets
    are the solution's (the SMO phase found them), so each column's cap on its working set starts large enough to
    hold its free set whole, and its first subproblem tries the exact steps first (:func:`_subproblem`'s ``near``)."""
    T = Y.shape[1]
    dtype, device = Y.dtype, Y.device
    scale = columns[0].scale
    sigma = [SIGMA_START * scale] * T
    floor = [SIGMA_FLOOR * scale] * T
    cap, cuts, last_free = [MAX_SET_FACTOR * q] * T, [0] * T, [0] * T
    if free_found:
        for t, col in enumerate(columns):
            n_free = int(_free(col, alpha[:, t]).sum())
            while 2 * n_free > cap[t]:
                cap[t] *= 2
    # each column's intercept intervals at its current point (the next working set and b come from them)
    bounds = [col.intercept_bounds(alpha[:, t], F[:, t] + col.h * alpha[:, t] - col.lin)
              for t, col in enumerate(columns)]
    b_all = torch.zeros(T, dtype=dtype, device=device)
    if intercept:
        b_all = torch.tensor([_best_intercept(bounds[t], 0.0) for t in range(T)], dtype=dtype, device=device)
    # the first subproblems predict their sets at this intercept (from 0, targets far from zero, e.g. around 1,000,
    # sent every coordinate to the same bound: the sets never balanced and alpha stayed at zero)
    b_sub = b_all.tolist()

    def solve_column(t: int, col: _Column) -> None:
        done[t] = False
        a = alpha[:, t]
        is_free = _free(col, a)
        n_free = int(is_free.sum())
        if exact[t] and 2 * n_free > cap[t] and abs(n_free - last_free[t]) <= STABLE_FREE * n_free:
            # an exact subproblem solve left the free set beyond the cap, about as large as before it: the solution's
            # own free set, taken whole at once
            while 2 * n_free > cap[t]:
                cap[t] *= 2
            cuts[t] = 0
        last_free[t] = n_free
        near = free_found and last_set[t] is None  # the column's first subproblem, from the SMO phase's point
        B = _select(col, a, bounds[t], q, intercept, float(b_all[t]), cap[t], is_free, near,
                    violator_share=violator_share[t])
        mostly_free = 2 * int(is_free[B].sum()) >= B.numel()
        # the points whose block the column's free-block factor holds (numbered in its last subproblem's set)
        held = None if factors[t].held() is None else last_set[t][factors[t].held()]
        if held is not None:  # the factor carries over when it holds little outside B
            outside = held[~torch.isin(held, B)]
            if not mostly_free or CARRY_RATIO * outside.numel() > held.numel():
                factors[t], held = FreeFactor(cholesky_shifted, float32=not factors[t].float32_failed), None
            elif outside.numel():
                B = torch.unique(torch.cat([B, outside]))
        if src.cache.full and B.numel() >= WHOLE_SHARE * src.n:  # K_BB is then the cache's buffer, not a copy
            B = torch.arange(src.n, device=B.device)
        # the set its last subproblem solved exactly, nothing outside it changed since, and no coordinate that it
        # adds violates its optimality conditions: the same subproblem, whose solution is where the column stands
        # (the stop rule decides; a repeat is solved only once)
        repeat[t] = exact[t] and not repeat[t] and last_set[t] is not None and \
            not _violates(B[~torch.isin(B, last_set[t])], bounds[t], float(b_all[t]))
        if repeat[t]:
            return
        last_set[t] = B
        # a free set that stays beyond the cap is the solution's: the cap doubles after CAP_PATIENCE cuts
        cuts[t] = cuts[t] + 1 if 2 * n_free > cap[t] else 0
        if cuts[t] >= CAP_PATIENCE:
            cap[t], cuts[t] = 2 * cap[t], 0
        K_BB = src.block(B)
        if held is not None:
            factors[t].relabel(torch.searchsorted(B, held))
        quick = quick_fails[t] < QUICK_FAILURES or gaps[t] < quick_failed_at[t] / QUICK_RETRY_DROP
        aB, b_sub[t], sigma[t], floor[t], exact[t], failed, snap_failed, found_degenerate = _subproblem(
            col, K_BB, B, a, F[:, t], b_sub[t], sigma[t], floor[t], factors[t], mostly_free, quick, near,
            interior=snap_fails[t] < SNAP_FAILURES or degenerate[t])
        snap_fails[t] += snap_failed
        degenerate[t] = degenerate[t] or found_degenerate
        if failed:
            quick_fails[t], quick_failed_at[t] = quick_fails[t] + 1, gaps[t]
        elif quick and mostly_free:
            quick_fails[t] = 0
        # a weight that cycled here is tried again only after a few more subproblems
        floor[t] = max(SIGMA_FLOOR * scale, floor[t] / FLOOR_DECAY)
        delta = aB - a[B]
        moved = torch.nonzero(delta).reshape(-1)
        if moved.numel():
            F[:, t] += src.update(moved, delta[moved])
            a[B] = aB
        taken = B[~is_free[B]]  # the coordinates the working set took besides the free ones
        freed = exact[t] and taken.numel() > 0 and int(_free(col, a, taken).sum()) >= GROWTH_FREED * taken.numel()
        violator_share[t] = min(MAX_VIOLATORS, 2 * violator_share[t]) if freed else MOSTLY_FREE_VIOLATORS
        if freed:  # a free set that grows so is no transient one: the cap holds it whole
            n_free = int(_free(col, a).sum())
            while 2 * n_free > cap[t]:
                cap[t] *= 2
        bounds[t] = col.intercept_bounds(a, F[:, t] + col.h * a - col.lin)
        if intercept:
            b_all[t] = _best_intercept(bounds[t], b_sub[t])
        # solved exactly, with no coordinate outside B violating its conditions now: the next working set can only
        # repeat this one (the stop rule need not wait an outer iteration to see it)
        done[t] = exact[t] and not _violates_outside(B, bounds[t], float(b_all[t]))

    exact = [False] * T
    violator_share = [MOSTLY_FREE_VIOLATORS] * T  # of its free set, the violators its next working set takes
    # each column's relative gap, its quick steps' failures in a row and the gap at the last one; its interior-point
    # solutions that would not snap
    gaps, quick_fails, quick_failed_at = [1.0] * T, [0] * T, [1.0] * T
    snap_fails = [0] * T
    # whether its optimum is degenerate (:func:`_crossover`): its mostly free subproblems then go to the interior point
    degenerate = [False] * T
    stall = GapStall(opts.tol, dtype, c_col)
    repeat, last_set = [False] * T, [None] * T
    # whether the column's last subproblem was one its next working set can only repeat (set by solve_column)
    done = [False] * T
    # each column's free-block factor, kept from one subproblem to the next (near the solution the free set
    # changes little between them)
    factors = [FreeFactor(cholesky_shifted) for _ in range(T)]

    solved = _SolvedStall(opts.tol, dtype)

    def at_floor(rec: dict) -> Optional[str]:
        gaps[:] = rec["column_rel_gap"]
        # every open column's working set repeats the one it solved exactly (or can only repeat it: ``done``): no
        # further progress is representable; else the gap's stall test, counting iterations whose subproblems were
        # all solved exactly
        still_open = [t for t in range(T) if rec["column_rel_gap"][t] > opts.tol]
        whole = all(repeat[t] or done[t] for t in still_open)
        if whole and at_rounding_floor(rec["rel_gap"], opts.tol, dtype):
            return "converged"
        return solved(rec["rel_gap"], whole) or stall(rec, all(exact[t] for t in still_open), alpha, src.matmul)

    return outer_loop(mon, opts, loss, Y, F, alpha, b_all, c_col, it, state, sigma, columns, solve_column, interrupted,
                      at_floor, level)


class _SolvedStall:
    """The working set's stop for a gap above the rounding floor that its exact solves of the whole problem no longer
    lower: once every open column's working set was the one its last subproblem solved exactly, with nothing outside
    it violating its conditions (``whole``), for ``SOLVED_PATIENCE`` iterations in a row (one of them solving the
    subproblem again) without the gap halving, and the gap below
    :data:`~joker_ext.defaults.CONVERGENCE_WARN_GAP`: 'converged' at the rounding floor, else 'stalled' (the outer
    loop then restores the best iterate). The floor grows with the conditioning of the free block: pinball at
    n = 10,000, C = 31, every coordinate free (the kernel's interpolant), solved its whole problem exactly at a gap of
    1.3e-10 and then repeated that solve 24 times, 0.8 s each, the gap moving between 5.5e-11 and 1.9e-10, until
    :data:`~joker_ext.active_set.FLAT_PATIENCE` stopped it (:class:`~joker_ext.active_set.GapStall`, whose noise
    test counts only the rounding of ``f = K alpha``)."""

    def __init__(self, tol: float, dtype: torch.dtype):
        self.tol, self.dtype = tol, dtype
        self.best = math.inf  # the smallest gap at a whole solve in this run of them
        self.count = 0

    def __call__(self, rel_gap: float, whole: bool) -> Optional[str]:
        if not whole or rel_gap > CONVERGENCE_WARN_GAP:
            self.best, self.count = math.inf, 0
            return None
        if rel_gap <= 0.5 * self.best:
            self.count = 0
        else:
            self.count += 1
        self.best = min(self.best, rel_gap)
        if self.count < SOLVED_PATIENCE:
            return None
        return "converged" if at_rounding_floor(rel_gap, self.tol, self.dtype) else "stalled"


def _smo_applies(cache: _ColumnCache, dtype) -> bool:
    """Whether the fit starts with the SMO phase: on the CPU, in float64, every kernel row kept, numba at hand."""
    return USE_SMO and smo_available() and cache.full and cache.buffer.device.type == "cpu" and dtype == torch.float64


def _smo_start(src: _KernelRows, diagK, columns, alpha, opts: SolverOptions, mon: Monitor,
               interrupted) -> torch.Tensor:
    """Each column of ``alpha`` moved, in place, by :func:`~joker_ext.smo.smo_phase` to a maximal violation of
    ``SMO_TOL`` times its targets' scale, until its sets settle (``SMO_SETTLED``), or for ``SMO_STEPS n`` steps at most
    (within the time budget); several columns (one-vs-rest, several targets) at once on torch's threads
    (:func:`~joker_ext.smo.smo_columns`). Returns ``K alpha``: read off the gradient of each phase short enough for
    its rounding to stay at the product's, the other columns through the cached rows."""
    deadline = math.inf if opts.max_time is None else mon.t0 + opts.max_time
    tols = [SMO_TOL * max(float(col.lin.abs().max()), float(col.kink), 1e-300) for col in columns]
    F = torch.empty_like(alpha)
    formed = smo_columns(src.cache, diagK, columns, alpha, tols=tols, deadline=deadline, interrupted=interrupted,
                         max_steps=int(SMO_STEPS * alpha.shape[0]), settled=SMO_SETTLED,
                         workers=torch.get_num_threads(), products=F)
    rest = [t for t, done in enumerate(formed) if not done]
    if rest:
        F[:, rest] = src.matmul(alpha[:, rest])
    return F


def working_set(operator, Y: torch.Tensor, loss: Loss, c: torch.Tensor, options: Optional[SolverOptions] = None,
                *, alpha0: Optional[torch.Tensor] = None, state0=None, start_iter: int = 0, callback=None,
                validation=None, snapshot=None, snapshot_every=None, intercept: bool = False,
                working_set_size: Optional[int] = None, cache_columns: Optional[int] = None, **_resume) -> SolverResult:
    """Minimise the dual by working-set decomposition (see the module docstring).

    Parameters
    ----------
    operator : ExactOperator
        Gives the kernel (``operator.kernel``) and the rows (``operator.data``).
    Y : Tensor (n, T)
    loss : Loss
        With ``loss.quadratic``.
    c : Tensor (n,)
        ``c_i = C w_i > 0``.
    options : SolverOptions
        ``max_iter`` outer iterations, ``tol`` on the relative duality gap, ``max_time``.
    alpha0 : Tensor (n, T), optional
        Warm start (projected on the box; with an intercept it must sum to zero per column to be used).
    state0 : dict, optional
        Not needed: ``K alpha`` is recomputed, and the intercept follows from ``alpha`` (the intervals of
        :meth:`_Column.intercept_bounds`), so a checkpoint's or warm start's intercept is implied by its ``alpha``.
    intercept : bool
        Fit an unregularized intercept per column (``state['intercept']``).
    working_set_size : int, optional
        ``q``, coordinates per subproblem (default :func:`joker_ext.engines.working_set_size`: 256 for a dual with a
        kink inside its box, epsilon-insensitive, else 512).
    cache_columns : int, optional
        Kernel rows kept: by default all ``n`` (``K`` is formed lazily) when ``n^2`` numbers fit half of
        :data:`~joker_ext.engines.DEFAULT_EXACT_MEMORY`, else ``min(n, 4 q)``.
    """
    report_dtype = Y.dtype
    Y = Y.to(WORKING_SET_DTYPE)  # its subproblems need it whatever the inputs' dtype; results are returned in theirs
    # identical rows make K_FF singular: one row per group, the same problem
    operator, Y, c, alpha0, expand = merge_duplicate_rows(operator, Y, c, alpha0)
    opts, c_col, alpha = box_qp_inputs("working_set", operator, Y, loss, c, options, alpha0)
    n, T = Y.shape
    dtype, device = Y.dtype, Y.device
    level = target_level(loss, Y, intercept)  # (solved for Y - level; the intercept reported is b + level)
    Y = Y - level
    if intercept:  # a start off the hyperplane sum a = 0 is not feasible: those columns start from zero
        alpha[:, alpha.sum(0).abs() > 1e-12 * alpha.abs().sum(0).clamp_min(1.0)] = 0.0
    q = max(2, min(int(default_size(loss) if working_set_size is None else working_set_size), n))
    if cache_columns is None:  # all of K when it fits half the default budget of the exact engines, else 4 q rows
        cache_columns = working_set_cache_rows(n, torch.finfo(dtype).bits // 8, q)
    mon = Monitor(opts, callback=callback, validation=validation, snapshot=snapshot, snapshot_every=snapshot_every,
                  dtype=dtype, report_dtype=report_dtype, expand=expand)
    state = {"f": torch.zeros_like(alpha)}
    if intercept:
        state["intercept"] = torch.zeros(T, dtype=dtype, device=device)
    status, it, rec = "max_iter", start_iter, None
    # inference mode: no autograd bookkeeping on the many small tensor operations of the active-set steps
    # (4-10 % of a hinge or epsilon-insensitive fit at n = 4000); the Monitor hands out ordinary tensors
    with sigint_as_flag(opts.handle_sigint) as sig, scipy_blas_on_one_thread(), torch.inference_mode():
        try:
            cache = _ColumnCache(operator, cache_columns, dtype, device)
            src = _KernelRows(cache)
            diagK = operator.kernel.diag(cache.X)
            columns = [_Column(None, diagK, loss.column(t), Y[:, t], c_col, intercept) for t in range(T)]
            smo = start_iter == 0 and _smo_applies(cache, dtype)  # a resumed fit goes on with the decomposition
            F = _smo_start(src, diagK, columns, alpha, opts, mon, lambda: sig.flag) if smo else src.matmul(alpha)
            reason, it, rec = _decompose(src, columns, loss, Y, c_col, alpha, F, intercept, q, mon, opts, it, state,
                                         lambda: sig.flag, level, free_found=smo and SMO_FREE_FOUND)
            status = reason or "max_iter"
        except (RuntimeError, MemoryError) as exc:
            if not is_out_of_memory(exc):
                raise
            status = "out_of_memory"
    return mon.result(alpha, state, it, status, rec)


register_solver("working_set", "exact", working_set, intercept=True)
