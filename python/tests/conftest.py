# Shared by pytest and run_tests.py: the package from this checkout, and test runs that never
# self-tune nor write the user's tuning database (as tests/support/main.cpp does for C++).
import os
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.environ.setdefault("MOEJIT_AUTOTUNE", "0")
os.environ.setdefault("MOEJIT_DB", os.path.join(tempfile.mkdtemp(prefix="moejit-tests-"), "tuning.sqlite"))
