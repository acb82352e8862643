# MOEJIT_* settings from Python and moejit.tune's mapping onto the CLI (no torch, no GPU).
import contextlib
import importlib
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

import moejit
from moejit import tuning

options_module = importlib.import_module("moejit.options")  # moejit.options is the function


@contextlib.contextmanager
def _cleared(*names):
    """Drops set_option's settings of these options on leaving, however the test ended: later
    tests read the environment conftest.py set."""
    try:
        yield
    finally:
        for name in names:
            moejit.clear_option(name)


def test_set_option_leaves_the_environment_alone(monkeypatch):
    # os.environ's setenv is not safe against the library's getenv on another thread.
    monkeypatch.setenv("MOEJIT_JOBS", "2")
    with _cleared("jobs"):
        moejit.set_option("jobs", 3)
        assert os.environ["MOEJIT_JOBS"] == "2" and moejit.get_option("MOEJIT_JOBS") == "3"
        # None unsets it, whatever the environment holds: the library's default applies.
        moejit.set_option("MOEJIT_JOBS", None)
        assert os.environ["MOEJIT_JOBS"] == "2" and moejit.get_option("jobs") is None
        assert moejit.options()["MOEJIT_JOBS"] is None
        moejit.clear_option("jobs")
        assert moejit.get_option("jobs") == "2"


def test_booleans_and_paths(monkeypatch, tmp_path):
    monkeypatch.delenv("MOEJIT_DISK_CACHE", raising=False)
    with _cleared("disk_cache", "db"):
        moejit.set_option("disk_cache", False)
        moejit.set_option("db", tmp_path / "t.sqlite")
        assert moejit.get_option("disk_cache") == "0" and "MOEJIT_DISK_CACHE" not in os.environ
        assert moejit.get_option("db") == str(tmp_path / "t.sqlite")
    assert set(moejit.options()) >= {"MOEJIT_DB", "MOEJIT_CACHE_DIR", "MOEJIT_AUTOTUNE", "MOEJIT_LIBRARY"}


def test_unknown_option():
    with pytest.raises(ValueError, match="unknown moejit option 'dbpath'"):
        moejit.set_option("dbpath", "x")


def test_the_library_refuses_a_bad_value_when_set():
    before = moejit.get_option("autotune")
    with _cleared("autotune"):
        with pytest.raises(moejit.InvalidArgumentError, match="MOEJIT_AUTOTUNE"):
            moejit.set_option("autotune", "off")
        assert moejit.get_option("autotune") == before
        moejit.set_option("autotune", True)


def test_package_options_need_no_library(tmp_path):
    # A fresh process, where nothing has loaded the library: setting MOEJIT_LIBRARY to a missing
    # file succeeds, and only looking for the library fails.
    missing = tmp_path / "libmoejit.so"
    script = (f"import moejit\nmoejit.set_option('library', {str(missing)!r})\n"
              "import os; assert 'MOEJIT_LIBRARY' not in os.environ and moejit._library._lib is None\n"
              "try:\n    moejit.library_path()\nexcept moejit.LibraryNotFoundError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k != "MOEJIT_LIBRARY"}
    env["PYTHONPATH"] = str(pathlib.Path(options_module.__file__).resolve().parents[1])
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert str(missing) in result.stdout


def test_the_cli_sees_options(monkeypatch, tmp_path, capfd):
    monkeypatch.setenv("MOEJIT_DB", str(tmp_path))  # restored after the test
    with _cleared("db", "cache_dir"):
        moejit.set_option("db", tmp_path / "seen.sqlite")
        assert os.environ["MOEJIT_DB"] == str(tmp_path)
        tuning.run_cli(["info"])
        assert str(tmp_path / "seen.sqlite") in capfd.readouterr().out
        # Unset reaches the CLI too: the environment's folder is not its.
        monkeypatch.setenv("MOEJIT_CACHE_DIR", str(tmp_path / "environment-cache"))
        moejit.set_option("cache_dir", None)
        tuning.run_cli(["info"])
        assert "environment-cache" not in capfd.readouterr().out


def test_the_cli_environment_holds_the_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("MOEJIT_CACHE_DIR", str(tmp_path))
    with _cleared("db", "cache_dir", "cli"):
        moejit.set_option("db", tmp_path / "t.sqlite")
        moejit.set_option("cache_dir", None)
        moejit.set_option("cli", tmp_path / "moejit")
        env = options_module.environment()
        assert env["MOEJIT_DB"] == str(tmp_path / "t.sqlite") and "MOEJIT_CACHE_DIR" not in env
        assert os.environ["MOEJIT_CACHE_DIR"] == str(tmp_path) and env is not os.environ
        # MOEJIT_CLI, this package's own: set_option's is the one looked for.
        with pytest.raises(moejit.LibraryNotFoundError, match=re.escape(str(tmp_path / "moejit"))):
            moejit.cli_path()


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
