# Shared by pytest and run_tests.py: the package from this checkout, and test runs that never
# self-tune, nor read or write the user's tuning database, nor read the shipped tables (as
# tests/support/main.cpp does for C++).
import atexit
import os
import pathlib
import shutil
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
_state = tempfile.mkdtemp(prefix="moejit-tests-")
atexit.register(shutil.rmtree, _state, ignore_errors=True)
os.environ.setdefault("MOEJIT_AUTOTUNE", "0")
os.environ.setdefault("MOEJIT_DB", os.path.join(_state, "tuning.sqlite"))
os.makedirs(os.path.join(_state, "shipped"))
os.environ.setdefault("MOEJIT_SHIPPED_DB_DIR", os.path.join(_state, "shipped"))
