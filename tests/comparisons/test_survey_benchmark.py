"""The random survey (joker_ext.comparisons.benchmarks.survey): every case prints its certificate, and where SVC is
the matching estimator our primal objective (the certified minimiser) is at most LIBSVM's up to 1e-6."""
import re

import pytest

from joker_ext.comparisons.benchmarks import survey


def test_survey_cases_are_certified_and_hinge_cases_reach_libsvms_objective(capsys):
    survey.main(["--count", "12", "--sizes", "300", "--repeats", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 12
    losses = {re.match(r"(?:BAD)?\s*\d+ (\S+)", line).group(1) for line in lines}
    assert {"hinge", "epsilon_insensitive"} <= losses
    for line in lines:
        assert float(re.search(r"rel gap +(\S+)", line).group(1)) <= survey.GAP_BOUND
        assert "warning" not in line
        primal = re.search(r"primal \(joker - sklearn\) / sklearn (\S+)", line)
        if primal:
            assert float(primal.group(1)) <= 1e-6


@pytest.mark.parametrize("argv, match", [(["--count", "0"], "count"), (["--sizes", "100"], "sizes"),
                                         (["--repeats", "0"], "repeats")])
def test_survey_rejects_bad_arguments(argv, match):
    with pytest.raises(SystemExit, match=match):
        survey.main(argv)
