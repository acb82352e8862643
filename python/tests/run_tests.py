#!/usr/bin/env python3
"""Runs these tests where pytest is not installed: `python3 python/tests/run_tests.py [files...]`
(default: every test_*.py here). It stands in for the little of pytest the tests use
(parametrize, raises, skip, importorskip, the tmp_path/monkeypatch/capfd fixtures); with pytest
installed, prefer `python3 -m pytest python/tests`."""

import functools
import importlib
import inspect
import itertools
import os
import pathlib
import re
import shutil
import sys
import tempfile
import traceback
import types

HERE = pathlib.Path(__file__).resolve().parent


class Skipped(Exception):
    pass


class _Raises:
    def __init__(self, expected, match=None):
        self.expected, self.match, self.value = expected, match, None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            raise AssertionError(f"DID NOT RAISE {self.expected}")
        if not issubclass(kind, self.expected):
            return False
        if self.match and not re.search(self.match, str(value)):
            raise AssertionError(f"{str(value)!r} does not match {self.match!r}")
        self.value = value
        return True


def _parametrize(names, values, ids=None):
    names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)

    def mark(fn):
        cases = []
        for index, value in enumerate(values):
            row = value if len(names) > 1 else (value,)
            label = ids(value) if callable(ids) else ids[index] if ids else str(index)
            cases.append((label, dict(zip(names, row))))
        fn._params = getattr(fn, "_params", []) + [cases]
        return fn
    return mark


def _skip(reason="", allow_module_level=False):
    raise Skipped(reason)


def _importorskip(name, reason=None):
    try:
        return importlib.import_module(name)
    except ImportError:
        raise Skipped(reason or f"could not import {name!r}") from None


def install_stand_in():
    stand_in = types.ModuleType("pytest")
    stand_in.raises = _Raises
    stand_in.skip = _skip
    stand_in.importorskip = _importorskip
    stand_in.mark = types.SimpleNamespace(parametrize=_parametrize)
    sys.modules["pytest"] = stand_in


_MISSING = object()


class MonkeyPatch:
    def __init__(self):
        self._undo = []

    def setenv(self, name, value):
        self._undo.append((os.environ, name, os.environ.get(name, _MISSING)))
        os.environ[name] = str(value)

    def delenv(self, name, raising=True):
        self._undo.append((os.environ, name, os.environ.get(name, _MISSING)))
        os.environ.pop(name, None)

    def setattr(self, target, name, value):
        self._undo.append((target, name, getattr(target, name, _MISSING)))
        setattr(target, name, value)

    def undo(self):
        for target, name, value in reversed(self._undo):
            if target is os.environ:
                if value is _MISSING:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            elif value is _MISSING:
                delattr(target, name)
            else:
                setattr(target, name, value)


class CapturedFd:
    """capfd's readouterr() over file descriptor 1 (child processes included)."""

    def __init__(self):
        self._file = tempfile.TemporaryFile()
        sys.stdout.flush()
        self._saved = os.dup(1)
        os.dup2(self._file.fileno(), 1)

    def readouterr(self):
        sys.stdout.flush()
        self._file.seek(0)
        out = self._file.read().decode()
        self._file.seek(0)
        self._file.truncate()
        return types.SimpleNamespace(out=out, err="")

    def close(self):
        sys.stdout.flush()
        os.dup2(self._saved, 1)
        os.close(self._saved)


def run_test(fn, kwargs):
    cleanups = []
    try:
        wanted = inspect.signature(fn).parameters
        if "tmp_path" in wanted:
            kwargs["tmp_path"] = pathlib.Path(tempfile.mkdtemp(prefix="moejit-test-"))
            cleanups.append(functools.partial(shutil.rmtree, kwargs["tmp_path"], ignore_errors=True))
        if "monkeypatch" in wanted:
            kwargs["monkeypatch"] = MonkeyPatch()
            cleanups.append(kwargs["monkeypatch"].undo)
        if "capfd" in wanted:
            kwargs["capfd"] = CapturedFd()
            cleanups.append(kwargs["capfd"].close)
        fn(**kwargs)
    finally:
        for cleanup in reversed(cleanups):
            cleanup()


def main(paths):
    sys.path.insert(0, str(HERE))
    install_stand_in()
    importlib.import_module("conftest")
    files = [pathlib.Path(p) for p in paths] or sorted(HERE.glob("test_*.py"))
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for path in files:
        try:
            module = importlib.import_module(path.stem)
        except Skipped as e:
            print(f"SKIPPED {path.name}: {e}")
            counts["skipped"] += 1
            continue
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if not name.startswith("test_") or fn.__module__ != module.__name__:
                continue
            for combo in itertools.product(*reversed(getattr(fn, "_params", [[("", {})]]))):
                label = "-".join(c[0] for c in combo if c[0])
                kwargs = {k: v for _, params in combo for k, v in params.items()}
                title = f"{path.name}::{name}" + (f"[{label}]" if label else "")
                try:
                    run_test(fn, kwargs)
                except Skipped as e:
                    counts["skipped"] += 1
                    print(f"SKIPPED {title}: {e}")
                except Exception:
                    counts["failed"] += 1
                    print(f"FAILED  {title}\n{traceback.format_exc()}")
                else:
                    counts["passed"] += 1
                    print(f"passed  {title}")
    print(", ".join(f"{v} {k}" for k, v in counts.items()))
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
