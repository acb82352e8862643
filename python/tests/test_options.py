# MOEJIT_* settings from Python and moejit.tune's mapping onto the CLI (no torch, no GPU).
import os
import time

import pytest

import moejit
from moejit import tuning


def test_set_option_sets_and_unsets_the_variable(monkeypatch):
    monkeypatch.delenv("MOEJIT_JOBS", raising=False)
    moejit.set_option("jobs", 3)
    assert os.environ["MOEJIT_JOBS"] == "3" and moejit.get_option("MOEJIT_JOBS") == "3"
    moejit.set_option("MOEJIT_JOBS", None)
    assert "MOEJIT_JOBS" not in os.environ and moejit.get_option("jobs") is None


def test_booleans_and_paths(monkeypatch, tmp_path):
    monkeypatch.delenv("MOEJIT_AUTOTUNE", raising=False)
    monkeypatch.delenv("MOEJIT_DB", raising=False)
    moejit.set_option("autotune", False)
    moejit.set_option("db", tmp_path / "t.sqlite")
    assert os.environ["MOEJIT_AUTOTUNE"] == "0"
    assert os.environ["MOEJIT_DB"] == str(tmp_path / "t.sqlite")
    assert set(moejit.options()) >= {"MOEJIT_DB", "MOEJIT_CACHE_DIR", "MOEJIT_AUTOTUNE", "MOEJIT_LIBRARY"}


def test_unknown_option():
    with pytest.raises(ValueError, match="unknown moejit option 'dbpath'"):
        moejit.set_option("dbpath", "x")


def test_the_cli_sees_options(monkeypatch, tmp_path, capfd):
    monkeypatch.setenv("MOEJIT_DB", str(tmp_path))  # restored after the test
    moejit.set_option("db", tmp_path / "seen.sqlite")
    tuning.run_cli(["info"])
    assert str(tmp_path / "seen.sqlite") in capfd.readouterr().out


def test_tune_arguments_mirror_the_cli():
    args = tuning.tune_arguments((128, 2048, 768, 8), [1024, 8192], dtype="bf16", modes=["train", "memeff"],
                                      roles=["fwd_up"], db="/tmp/t.sqlite", devices=[0, 1], shard=(1, 4),
                                      force=True, budget=30)
    assert args == ["tune", "--shape", "128,2048,768,8", "--tokens", "1024,8192", "--dtype", "bf16", "--modes",
                    "train,memeff", "--roles", "fwd_up", "--db", "/tmp/t.sqlite", "--devices", "0,1", "--shard",
                    "1/4", "--force", "--budget", "30"]
    assert tuning.tune_arguments() == ["tune"]
    assert tuning.tune_arguments(tokens=4096, devices="all", shard="0/2") == [
        "tune", "--tokens", "4096", "--devices", "all", "--shard", "0/2"]
    # Single values and the CLI's spellings are taken as the CLI takes them.
    assert tuning.tune_arguments("64,2048,1408,6", devices=0, timing="sustained", incumbents="db/NVIDIA_H200.json") == [
        "tune", "--shape", "64,2048,1408,6", "--devices", "0", "--timing", "sustained", "--incumbents",
        "db/NVIDIA_H200.json"]


def test_tune_errors_carry_the_cli_message():
    # Rejected while parsing, before any GPU is looked for.
    with pytest.raises(moejit.InvalidArgumentError, match="--shape"):
        moejit.tune(shape=(8, 128, 64, 9), tokens=[64])
    with pytest.raises(moejit.InvalidArgumentError, match="shape"):
        moejit.tune(shape=(8, 128, 64))


def test_cli_lookup(monkeypatch, tmp_path):
    assert moejit.cli_path().name == "moejit"
    monkeypatch.setenv("MOEJIT_CLI", str(tmp_path / "missing"))
    with pytest.raises(moejit.LibraryNotFoundError, match="MOEJIT_CLI"):
        moejit.cli_path()


def test_cli_stderr_is_shown_while_the_cli_runs(monkeypatch, tmp_path):
    # The fake CLI waits for its first stderr line to be seen before going on: a run_cli that
    # reported stderr only at exit would let it time out, and it would then exit 0.
    seen = tmp_path / "seen"
    cli = tmp_path / "moejit"
    cli.write_text("#!/bin/sh\n"
                   "echo 'moejit tune: gpu0 T=64: first item failed' >&2\n"
                   "for _ in $(seq 100); do\n"
                   f"  if [ -e '{seen}' ]; then echo 'moejit tune: second' >&2; exit 1; fi\n"
                   "  sleep 0.1\n"
                   "done\n")
    cli.chmod(0o755)
    monkeypatch.setenv("MOEJIT_CLI", str(cli))

    class Watcher:
        def __init__(self):
            self.text = ""

        def write(self, text):
            self.text += text
            if "first item failed" in text:
                seen.touch()

        def flush(self):
            pass

    watcher = Watcher()
    monkeypatch.setattr(tuning.sys, "stderr", watcher)
    with pytest.raises(moejit.MoejitError, match="first item failed\nmoejit tune: second"):
        moejit.tune(tokens=64)
    assert watcher.text.splitlines() == ["moejit tune: gpu0 T=64: first item failed", "moejit tune: second"]


def test_an_interrupted_run_stops_the_cli(monkeypatch, tmp_path):
    # The fake CLI would run 30 s; an exception while its output is copied (Ctrl-C in a notebook
    # reaches only this process) must stop it, not wait for it.
    pid_file = tmp_path / "pid"
    cli = tmp_path / "moejit"
    cli.write_text(f"#!/bin/sh\necho $$ > '{pid_file}'\necho 'moejit tune: started' >&2\nexec sleep 30\n")
    cli.chmod(0o755)
    monkeypatch.setenv("MOEJIT_CLI", str(cli))

    class Interrupting:
        def write(self, text):
            raise KeyboardInterrupt

        def flush(self):
            pass

    monkeypatch.setattr(tuning.sys, "stderr", Interrupting())
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        moejit.tune(tokens=64)
    assert time.monotonic() - start < 10
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
