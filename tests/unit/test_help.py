"""Help that explains (issue 27): every run flag has a sentence, its default and its
choices, from the one place the setting is declared; sub-commands offer only the flags they
read; ``phalanx --version`` works."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from phalanx import __version__
from phalanx.cli import build_parser
from phalanx.config import RunConfig


def _sub(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _flags(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in p._actions for s in a.option_strings}


def test_every_train_flag_has_a_sentence_a_default_and_its_choices():
    flags = _flags(_sub("train"))
    for f in dataclasses.fields(RunConfig):
        action = flags["--" + f.name.replace("_", "-")]
        text = action.help or ""
        assert len(text.split()) >= 4, (f.name, text)  # a sentence, not a bare default
        if f.default not in ("", None, dataclasses.MISSING):
            assert "default" in text, (f.name, text)
        for choice in f.metadata.get("choices", ()):
            assert choice in text, (f.name, choice, text)
    assert "adam" in flags["--rule"].help and "sync" in flags["--strategy"].help
    assert "0.05" in flags["--lr"].help  # the rule's default learning rate is named


def test_compare_offers_only_the_flags_it_reads():
    flags = _flags(_sub("compare"))
    assert "--strategies" in flags and "--seeds" in flags and "--reuse" in flags
    for train_only in ("--strategy", "--resume", "--kill-worker", "--overwrite"):
        assert train_only not in flags


def test_top_level_help_and_version(capsys):
    parser = build_parser()
    text = parser.format_help()
    for command in ("train", "simulate", "schedule", "compare", "experiments"):
        assert command in text
    assert "``" not in text
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"phalanx {__version__}"
    assert "{," not in _sub("simulate").format_help()  # no empty choice
