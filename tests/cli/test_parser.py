"""The ``cahp`` parser: whole flag names only, help on every flag, "did you mean" for the unknown ones."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from app.cli import build_parser, main
from app.cli.exit_codes import ExitCode


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    found: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        found.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    walk(f"{name} {sub}", child)

    walk("cahp", build_parser())
    return found


def test_every_parser_takes_whole_flag_names_only_and_every_argument_has_help() -> None:
    parsers = _parsers()
    assert len(parsers) > 15
    for name, parser in parsers:
        assert parser.allow_abbrev is False, name
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help and action.help.strip(), f"{name} {action.option_strings or action.dest} has no help"


def test_an_abbreviated_flag_is_refused_with_the_whole_name_suggested(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["prune", "model", "data", "-o", "out", "--epoch", "1"])
    assert stopped.value.code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "cahp prune: error: unrecognized arguments: --epoch 1; did you mean --epochs?" in err
    assert err.startswith("usage: cahp prune ")  # the subcommand's usage, not the top level's


def test_an_underscored_flag_is_refused_by_its_subcommand_with_the_dashed_name(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["prune", "model", "data", "-o", "out", "--poly_degree", "3"])
    err = capsys.readouterr().err
    assert err.startswith("usage: cahp prune ") and "did you mean --poly-degree?" in err
    with pytest.raises(SystemExit):
        main(["wait", "j1", "--follw"])
    assert "cahp wait: error: unrecognized arguments: --follw; did you mean --follow?" in capsys.readouterr().err


def test_an_unknown_job_setting_is_refused_before_anything_is_uploaded(capsys: pytest.CaptureFixture[str],
                                                                        tmp_path: Any) -> None:
    # The model "directory" does not exist: had the setting been accepted, uploading it would fail instead.
    code = main(["submit", "--model", str(tmp_path / "absent"), "--dataset", "hf://datasets/x/y", "--param",
                 "epoch=1", "--url", "http://127.0.0.1:9", "--timeout", "0"])
    assert code == ExitCode.USAGE
    assert "cahp: --param epoch: no job setting has this name; did you mean epochs?" in capsys.readouterr().err


def test_a_setting_given_as_a_submit_flag_is_pointed_to_param(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["submit", "--model", "m", "--dataset", "d", "--epoch", "1"])
    assert stopped.value.code == ExitCode.USAGE
    assert "unrecognized arguments: --epoch 1; did you mean --param epochs=VALUE?" in capsys.readouterr().err


def test_a_bad_setting_value_is_refused_before_anything_is_packed(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Any) -> None:
    # Had anything been packed or sent, the absent dataset or the unreachable server would have answered.
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"\0" * 1024)
    code = main(["submit", "--model", str(model), "--dataset", str(tmp_path / "absent"), "--param", "epochs=one",
                 "--url", "http://127.0.0.1:9", "--timeout", "0"])
    assert code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "cahp: --param: `epochs` must be a number" in err and "got 'one'" in err and "upload" not in err


def test_a_misspelt_flag_is_named_even_when_a_required_argument_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    required = "error: the following arguments are required:"
    for argv, said in (
            (["prune", "model", "data", "--ouput", "out"],
             f"cahp prune: {required} --output/-o; unrecognized arguments: --ouput; did you mean --output?"),
            (["submit", "--modle", "m", "--dataset", "d"],
             f"cahp submit: {required} --model; unrecognized arguments: --modle; did you mean --model?"),
            (["submit", "--dataset", "d", "--epoch", "1"],
             "unrecognized arguments: --epoch; did you mean --param epochs=VALUE?"),
            (["wait", "--follw"],
             f"cahp wait: {required} job; unrecognized arguments: --follw; did you mean --follow?")):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == ExitCode.USAGE
        assert said in capsys.readouterr().err, argv


def test_every_flag_of_every_command_misspelt_by_a_letter_gets_its_whole_name_suggested(
        capsys: pytest.CaptureFixture[str]) -> None:
    checked = 0
    for name, parser in _parsers():
        if any(isinstance(action, argparse._SubParsersAction) for action in parser._actions):
            continue  # `cahp` itself (and any other parser of subcommands): its words are the commands
        flags = {s for action in parser._actions for s in action.option_strings}
        for flag in sorted(f for f in flags if f.startswith("--") and f != "--help" and len(f) > 5):
            misspelt = flag[:-1]
            if misspelt in flags:
                continue
            with pytest.raises(SystemExit):
                main([*name.split()[1:], misspelt])
            err = capsys.readouterr().err
            assert f"unrecognized arguments: {misspelt}" in err and "did you mean" in err, (name, misspelt, err)
            assert flag in err.rsplit("did you mean", 1)[1], (name, misspelt, err)
            checked += 1
    assert checked > 100


def test_a_missing_required_argument_names_no_word_the_parser_took_as_unrecognized(
        capsys: pytest.CaptureFixture[str]) -> None:
    # A short flag with its value attached (-o/tmp/out is --output /tmp/out), "-" (a positional, as
    # argparse reads it) and a value with a space that starts with a dash are all words argparse took.
    for argv, missing in ((["prune", "model", "-o/tmp/out"], "dataset"),
                          (["prune", "-", "data"], "--output/-o"),
                          (["prune", "model", "-o", "-a b"], "dataset")):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == ExitCode.USAGE
        err = capsys.readouterr().err
        assert f"the following arguments are required: {missing}" in err, argv
        assert "unrecognized" not in err, (argv, err)
