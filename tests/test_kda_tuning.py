"""kdactl.kda.Tuning: the named kernel-variant options, their text form and the errors that name what is
wrong; prefill takes nothing else as ``tuning``."""

from __future__ import annotations

import argparse

import pytest

from kdactl.kda.tuning import AUTO, Tuning, tuning_argument


@pytest.mark.parametrize(
    "text,tuning",
    [
        ("auto", AUTO),
        ("warps=8,stages=4", Tuning(warps=8, stages=4)),
        (" stages = 8 , warps = 2 ", Tuning(warps=2, stages=8)),
        ("warps=4", Tuning(warps=4)),
        ("stages=8", Tuning(stages=8)),
        ("warps=0", AUTO),
    ],
)
def test_parse(text, tuning):
    assert Tuning.parse(text) == tuning


@pytest.mark.parametrize("tuning", [AUTO, Tuning(warps=2), Tuning(stages=4), Tuning(warps=8, stages=4)])
def test_text_form_round_trips(tuning):
    assert Tuning.parse(str(tuning)) == tuning


def test_text_form_names_the_fields_given():
    assert (str(AUTO), str(Tuning(warps=4)), str(Tuning(4, 8))) == ("auto", "warps=4", "warps=4,stages=8")


@pytest.mark.parametrize(
    "text,message",
    [
        ("84", r"'84' is not NAME=VALUE with NAME one of warps, stages"),
        ("warp=8", r"'warp=8' is not NAME=VALUE"),
        ("warps=8,,stages=4", r"'' is not NAME=VALUE"),
        ("", r"'' is not NAME=VALUE"),
        ("warps=eight", r"warps must be an integer, got 'eight'"),
        ("warps=8,warps=4", r"warps is given twice"),
        ("warps=3", r"warps must be one of 2, 4, 8, or 0 for the launcher's choice; got 3"),
        ("stages=2", r"stages must be one of 4, 8, or 0 for the launcher's choice; got 2"),
        ("warps=-4", r"warps must be one of 2, 4, 8"),
    ],
)
def test_bad_text_is_refused_naming_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        Tuning.parse(text)


@pytest.mark.parametrize("fields", [{"warps": 16}, {"stages": 1}, {"warps": 4.0}, {"stages": True}, {"warps": "8"}])
def test_bad_fields_are_refused(fields):
    with pytest.raises(ValueError, match=f"tuning: {next(iter(fields))} must be one of"):
        Tuning(**fields)


def test_argparse_type_keeps_the_message():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tuning", type=tuning_argument)
    assert parser.parse_args(["--tuning", "warps=2,stages=8"]).tuning == Tuning(2, 8)
    with pytest.raises(argparse.ArgumentTypeError, match="warps must be one of 2, 4, 8"):
        tuning_argument("warps=5")


def test_prefill_refuses_a_packed_tuning_code(monkeypatch):
    """The decimal codes (84: 8 stages, 4 warps) are gone: an int is refused, not read as a shape."""
    import kdactl.kda as kda
    from kdactl.kda import validation
    from tests.kda_inputs import make_inputs
    from tests.test_kda_routes import problem

    x, _ = make_inputs(1, 16, 2)
    monkeypatch.setattr(validation, "validate", lambda *a, **kw: problem(T=16, H=2))
    monkeypatch.setattr(validation, "validate_fused", lambda *a, **kw: None)
    with pytest.raises(
        ValueError, match=r"tuning must be a kdactl.kda.Tuning \(e.g. Tuning\(warps=8, stages=4\)\), got int"
    ):
        kda.prefill(**x, route="chunk", tuning=84)
