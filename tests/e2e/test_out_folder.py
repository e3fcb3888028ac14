"""--out for train, compare, experiments and demo: a bad folder is one line and exit 2; a
run never mixes with an earlier one (issue 18, causes 5 and 6)."""

import json
import os

import pytest

from phalanx.cli import main

QUICK = ["--data", "synthetic", "--model", "mlp", "--max-steps", "3", "--no-progress",
         "--no-tensorboard"]


def run(capsys, *args):
    try:
        code = main(list(args))
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def bad_outs(tmp_path):
    (tmp_path / "file").write_text("x")
    return {"a regular file": (str(tmp_path / "file"), "exists and is not a directory"),
            "under a file": (str(tmp_path / "file" / "sub"), "is a file, not a directory"),
            "in /proc": ("/proc/self/phalanx-out", "system folder")}


@pytest.mark.parametrize("case", ["a regular file", "under a file", "in /proc"])
@pytest.mark.parametrize("command", [
    ["train", *QUICK],
    ["compare", "--strategies", "single", *QUICK],
    ["experiments", "run", "averaging-period", "--quick"],
    ["demo", "--data", "synthetic"],
])
def test_bad_out_is_one_line_for_every_command(tmp_path, capsys, command, case):
    out, match = bad_outs(tmp_path)[case]
    code, err = run(capsys, *command, "--out", out)
    assert code == 2
    assert err.startswith("phalanx: error: --out") and match in err, err
    assert err.count("\n") == 1
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_out_is_one_line(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    code, err = run(capsys, "train", *QUICK, "--out", str(ro / "run"))
    assert code == 2 and "cannot write there" in err


def test_non_empty_run_folder_is_refused_then_overwritten(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(capsys, "train", *QUICK, "--out", str(out))[0] == 0
    (out / "summary.json").write_text('{"strategy": "old"}')
    (out / "ps_shard0.ckpt").write_bytes(b"old")  # what an earlier PS run would leave
    code, err = run(capsys, "train", *QUICK, "--out", str(out))
    assert code == 2 and "not empty" in err and "--overwrite" in err, err
    assert json.loads((out / "summary.json").read_text()) == {"strategy": "old"}  # untouched
    assert run(capsys, "train", *QUICK, "--out", str(out), "--overwrite")[0] == 0
    assert json.loads((out / "summary.json").read_text())["strategy"] == "single"
    assert not (out / "ps_shard0.ckpt").exists()  # nothing of the earlier run is left


def test_overwrite_never_deletes_files_a_run_did_not_write(tmp_path, capsys):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    code, err = run(capsys, "train", *QUICK, "--out", str(out), "--overwrite")
    assert code == 2 and "thesis.tex" in err
    assert (out / "thesis.tex").read_text() == "precious"


def test_resume_with_another_out_is_refused(tmp_path, capsys):
    code, err = run(capsys, "train", *QUICK, "--resume", str(tmp_path / "a"), "--out",
                    str(tmp_path / "b"))
    assert code == 2 and "a resumed run writes into its own folder" in err
    assert not (tmp_path / "b").exists()


def test_two_runs_into_one_folder_at_once_are_refused(tmp_path):
    from phalanx.entry.paths import hold_run_dir, prepare_run_dir
    from phalanx.errors import ConfigError

    lock = hold_run_dir(tmp_path / "run")  # as a running `phalanx train` holds it
    with pytest.raises(ConfigError, match="another phalanx run is writing"):
        hold_run_dir(tmp_path / "run")
    lock.close()
    hold_run_dir(tmp_path / "run").close()
    prepare_run_dir(tmp_path / "run", overwrite=False, resume=False)  # the lock is not a run


def test_overwrite_with_resume_is_refused(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    code, err = run(capsys, "train", *QUICK, "--resume", str(tmp_path / "a"), "--overwrite")
    assert code == 2 and "--overwrite and --resume" in err
