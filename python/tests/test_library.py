# The ctypes binding without torch or a GPU: loading, version, status names, host memory sizes,
# and library errors surfacing as Python exceptions with the library's message.
import itertools
import threading

import pytest

import moejit
from moejit import _layout, _library


def test_library_loads_and_reports_its_version():
    assert moejit.library_path().is_file()
    assert moejit.version() == moejit.__version__


def test_status_names_match_the_c_enum():
    names = [_library.status_name(code) for code in range(12)]
    assert names == ["ok", "invalid_argument", "no_device", "cuda", "compile", "database", "io", "unsupported",
                     "state", "internal", "out_of_memory", "unknown"]


def test_out_of_memory_is_a_memory_error():
    # The status a call returns when host or device memory runs out: what a training loop catches
    # to free memory or shrink its batch, without torch as with it (test_torch_meta.py).
    with pytest.raises(MemoryError) as info:
        _library.check(10, "moejit_forward")
    assert isinstance(info.value, moejit.OutOfMemoryError) and isinstance(info.value, moejit.MoejitError)
    assert info.value.status == "out_of_memory" and info.value.function == "moejit_forward"


def test_problem_memory_is_computed_on_the_host():
    train = _library.problem_memory(_library.make_problem(64, 8, 128, 64, 2, "bf16", "train"))
    infer = _library.problem_memory(_library.make_problem(64, 8, 128, 64, 2, "bf16", "infer"))
    memeff = _library.problem_memory(_library.make_problem(64, 8, 128, 64, 2, "bf16", "memeff"))
    # Same figures as tests/unit/test_c_abi.cpp, which derives them: routing arrays, pre_act
    # [128, 128] bf16 and the state's 256-byte stamp. T=64's 12 tiles fit one 256-byte block a tile table; T=4000's 70 (128-row
    # tiles: 8000 // 128 + 8) take two, so that figure depends on the tile count.
    assert train.saved_bytes == 7 * 256 + 2 * 512 + 128 * 128 * 2 + 256
    assert infer.saved_bytes == 0 and infer.backward_workspace_bytes == 0
    assert memeff.backward_workspace_bytes < train.backward_workspace_bytes
    large = _library.problem_memory(_library.make_problem(4000, 8, 128, 64, 2, "bf16", "train"))
    assert large.saved_bytes == 3 * 256 + 4 * 256 + 2 * 2 * 256 + 2 * 32000 + 8000 * 128 * 2 + 256


@pytest.mark.parametrize("mode", ["train", "infer", "memeff"])
def test_saved_size_arithmetic_matches_the_library(mode):
    # _layout mirrors the library's layout for PyTorch's symbolic shapes: a drift shows here.
    # Token counts cross the tile-height buckets and the routing chunk size (512 pairs).
    for t, e, i, k in itertools.product((1, 7, 64, 255, 256, 257, 1000, 4096, 33000), (1, 7, 8, 128), (47, 64, 768),
                                        (1, 2, 8)):
        if k <= e:
            want = _library.problem_memory(_library.make_problem(t, e, 128, i, k, "bf16", mode)).saved_bytes
            assert _layout.saved_bytes(t, e, i, k, mode == "infer") == want, (t, e, i, k)


@pytest.mark.parametrize("field, value, argument", [
    ("topk", 9, "topk"),
    ("tokens", 0, "tokens"),
    ("experts", 5000, "experts"),
    ("hidden", 0, "hidden"),
    ("dtype", 7, "dtype"),
])
def test_bad_problems_raise_with_the_library_message(field, value, argument):
    problem = _library.make_problem(64, 8, 128, 64, 2)
    setattr(problem, field, value)
    with pytest.raises(moejit.InvalidArgumentError, match=f"^{argument}: ") as info:
        _library.Plan(problem)
    assert info.value.status == "invalid_argument"
    assert info.value.function == "moejit_plan_create"
    assert isinstance(info.value, ValueError)
    with pytest.raises(moejit.InvalidArgumentError, match=f"^{argument}: "):
        _library.problem_memory(problem)


@pytest.mark.parametrize("field, value", [
    ("experts", 2**32 + 8),  # ctypes alone would keep the low 32 bits: E = 8
    ("hidden", 2**32 + 64),
    ("intermediate", 2**31 + 5),  # would wrap to -2147483643
    ("topk", -2**31 - 1),
    ("tokens", 2**63),  # int64_t
    ("tokens", 2**64 + 64),
])
def test_values_outside_the_c_fields_are_rejected_before_the_library(field, value):
    # Raised in Python before any library call (none is loaded for it).
    args = dict(tokens=64, experts=8, hidden=128, intermediate=64, topk=2)
    with pytest.raises(moejit.InvalidArgumentError, match=f"^{field}: .*got {value}$") as info:
        _library.make_problem(**dict(args, **{field: value}))
    assert isinstance(info.value, ValueError) and info.value.status == "invalid_argument"
    with pytest.raises(moejit.InvalidArgumentError, match="^dtype: "):
        _library.make_problem(**args, dtype=2**32)


def test_c_field_extremes_reach_the_library_unwrapped():
    # In range for ctypes, out of range for the library: its own message, not a wrapped value.
    with pytest.raises(moejit.InvalidArgumentError, match="^experts: ") as info:
        _library.problem_memory(_library.make_problem(1, 2**31 - 1, 64, 64, 1))
    assert info.value.function == "moejit_problem_memory"
    assert _library.make_problem(2**63 - 1, -2**31, 64, 64, 1).key()[:2] == (2**63 - 1, -2**31)


def test_a_plan_without_a_context_raises_no_device():
    # A fresh thread has no current CUDA context (and a CPU machine has no driver at all).
    caught = []
    thread = threading.Thread(target=lambda: _capture(caught, lambda: _library.Plan(_library.make_problem(64, 8, 128, 64, 2))))
    thread.start()
    thread.join()
    assert len(caught) == 1 and isinstance(caught[0], moejit.NoDeviceError), caught
    assert len(str(caught[0])) > 10


class _BlockingLibrary:
    """Stands in for the loaded library: plan_create hands out a handle, and a forward holds
    until released, as a real one does with the GIL released."""

    def __init__(self):
        self.events, self.inside, self.release = [], threading.Event(), threading.Event()

    def moejit_plan_create(self, problem, handle):
        handle._obj.value = 0x1000
        return 0

    def moejit_plan_memory(self, handle, memory):
        return 0

    def moejit_forward(self, handle, *args):
        self.inside.set()
        self.release.wait(10)
        self.events.append(("forward returned", handle.value))
        return 0

    def moejit_plan_destroy(self, handle):
        self.events.append(("destroyed", handle.value))


def test_closing_a_plan_waits_for_a_call_under_way(monkeypatch):
    # close() on another thread while a call runs destroyed the plan under it (a use after free).
    fake = _BlockingLibrary()
    monkeypatch.setattr(_library, "_lib", fake)
    plan = _library.Plan(_library.make_problem(64, 8, 128, 64, 2))
    calling = threading.Thread(target=plan.forward, args=(0,) * 11, daemon=True)
    closing = threading.Thread(target=plan.close, daemon=True)
    try:
        calling.start()
        assert fake.inside.wait(10)
        closing.start()
        closing.join(0.3)
        assert fake.events == []  # close() waits for the call
    finally:
        fake.release.set()
    calling.join(10)
    closing.join(10)
    assert fake.events == [("forward returned", 0x1000), ("destroyed", 0x1000)]
    plan.close()  # once only
    assert len(fake.events) == 2


def _capture(caught, fn):
    try:
        fn()
    except Exception as e:  # handed to the main thread's assertion
        caught.append(e)


def test_unknown_names_are_rejected_before_the_library():
    with pytest.raises(ValueError, match="mode must be one of"):
        _library.make_problem(64, 8, 128, 64, 2, mode="training")
    with pytest.raises(ValueError, match="dtype must be one of"):
        _library.make_problem(64, 8, 128, 64, 2, dtype="fp32")


def test_library_lookup_order(monkeypatch, tmp_path):
    monkeypatch.delenv("MOEJIT_LIBRARY", raising=False)
    package, tree = _library.library_candidates()
    assert package.parent.name == "lib" and package.parent.parent.name == "moejit"
    assert tree.parts[-4:] == ("build", "release", "src", "libmoejit.so")
    missing = tmp_path / "nowhere" / "libmoejit.so"
    monkeypatch.setenv("MOEJIT_LIBRARY", str(missing))
    assert _library.library_candidates() == [missing]
    with pytest.raises(moejit.LibraryNotFoundError, match="MOEJIT_LIBRARY"):
        _library.library_path()
