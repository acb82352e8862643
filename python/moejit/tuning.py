"""moejit.tune: offline tuning through the `moejit tune` CLI, with the same options.

The CLI is looked for at MOEJIT_CLI (set_option's, else the environment's), then moejit/bin/moejit
inside this package, then the source tree's build/release/tools/moejit/moejit, then `moejit` on
PATH. It runs as a child process with this process's environment and moejit.set_option()'s
settings (MOEJIT_DB, ...) in it.
"""

import os
import pathlib
import shutil
import subprocess
import sys

from .errors import InvalidArgumentError, LibraryNotFoundError, MoejitError
from .options import environment, get_option

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
_REPO_CLI = _PACKAGE_DIR.parent.parent / "build" / "release" / "tools" / "moejit" / "moejit"


def cli_path():
    """The moejit CLI that moejit.tune runs."""
    explicit = get_option("cli")
    if explicit:
        candidates = [pathlib.Path(explicit)]
    else:
        on_path = shutil.which("moejit")
        candidates = [_PACKAGE_DIR / "bin" / "moejit", _REPO_CLI] + ([pathlib.Path(on_path)] if on_path else [])
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    tried = ", ".join(str(p) for p in candidates)
    raise LibraryNotFoundError(f"the moejit CLI was not found (tried {tried}); build it or set MOEJIT_CLI", status="io")


def _joined(values):
    return values if isinstance(values, str) else ",".join(str(v) for v in values)


def tune_arguments(shape=None, tokens=None, *, dtype=None, modes=None, roles=None, db=None, devices=None,
                   shard=None, force=False, budget=None, timing=None, incumbents=None):
    """The `moejit tune` arguments for these options (None: the CLI's default)."""
    args = ["tune"]
    if shape is not None:
        dims = shape.split(",") if isinstance(shape, str) else shape
        if len(dims) != 4:
            raise InvalidArgumentError(f"shape: expected (E, H, I, K), got {shape!r}", status="invalid_argument")
        args += ["--shape", _joined(dims)]
    if tokens is not None:
        args += ["--tokens", _joined([tokens] if isinstance(tokens, int) else tokens)]
    if dtype is not None:
        args += ["--dtype", dtype]
    if modes is not None:
        args += ["--modes", _joined(modes)]
    if roles is not None:
        args += ["--roles", _joined(roles)]
    if db is not None:
        args += ["--db", os.fspath(db)]
    if devices is not None:
        args += ["--devices", _joined([devices] if isinstance(devices, int) else devices)]
    if shard is not None:
        args += ["--shard", shard if isinstance(shard, str) else f"{shard[0]}/{shard[1]}"]
    if force:
        args.append("--force")
    if budget is not None:
        args += ["--budget", str(budget)]
    if timing is not None:
        args += ["--timing", timing]
    if incumbents is not None:
        args += ["--incumbents", os.fspath(incumbents)]
    return args


def tune(shape=None, tokens=None, *, dtype=None, modes=None, roles=None, db=None, devices=None, shard=None,
         force=False, budget=None, timing=None, incumbents=None):
    """Runs `moejit tune` (README, CLI): tunes every (token count, mode) of one shape into a
    database; keys already tuned are skipped unless force. Mirrors the CLI's options:

      shape    (E, H, I, K) or "E,H,I,K", default the CLI's (128, 2048, 768, 8)
      tokens   token counts (int or list), default the CLI's: for every tuning key a T up to
               32768 reaches, the largest such T
      dtype    "bf16" or "fp16";  modes: "train", "infer", "memeff" (default train and infer)
      roles    kernel roles to tune (default all);  db: database path (default MOEJIT_DB)
      devices  "all", a GPU ordinal or a list of them;  shard: (i, n) or "i/n";  budget: seconds per item
      timing   "burst" (default) or "sustained";  incumbents: an earlier table (JSON) whose
               winners are kept where they tie

    Progress goes to this process's stdout. Raises InvalidArgumentError for options the CLI
    rejects and MoejitError for other failures, with the CLI's message.
    """
    args = tune_arguments(shape, tokens, dtype=dtype, modes=modes, roles=roles, db=db, devices=devices,
                          shard=shard, force=force, budget=budget, timing=timing, incumbents=incumbents)
    return run_cli(args)


def run_cli(args):
    """Runs the CLI with `args`. Its stdout passes through; its stderr (warnings, the per-item
    lines of a long tune) is copied to sys.stderr line by line as it comes, and becomes the
    message of a failure."""
    sys.stdout.flush()
    with subprocess.Popen([str(cli_path())] + list(args), stderr=subprocess.PIPE, text=True, errors="replace",
                          env=environment()) as child:
        lines = []
        try:
            for line in child.stderr:
                sys.stderr.write(line)
                sys.stderr.flush()
                lines.append(line)
        except BaseException:
            # Interrupted (Ctrl-C in a notebook reaches only this process): a tune left running
            # would hold the GPU and keep writing the database.
            child.kill()
            raise
        returncode = child.wait()
    if returncode != 0:
        message = "".join(lines).strip() or f"moejit {args[0]} exited with status {returncode}"
        error = InvalidArgumentError if returncode == 2 else MoejitError
        status = "invalid_argument" if returncode == 2 else "internal"
        raise error(message, status=status, function=f"moejit {args[0]}")
