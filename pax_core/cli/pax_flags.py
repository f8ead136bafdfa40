"""Pax's command line (``paxml/main.py``'s flags) read as ``pax``'s, so a Pax launch script runs
with ``pax`` in place of ``python paxml/main.py``.

``pax --exp=X --job_log_dir=D --mode=train`` is ``pax train --exp X --job-dir D``; flags with a
meaning here are translated (``--restore_checkpoint_step``, ``--eval_on_test``,
``--fdl_config_file``, the multi-process ones, Fiddle's ``--fdl.KEY=VALUE``), and flags that no
longer apply are dropped with one line each saying why. absl's spellings are accepted:
``--flag=value``, ``--flag value``, and ``--flag`` / ``--noflag`` for booleans.
"""

from __future__ import annotations

from pax_core.errors import UsageError, warn

# Pax flag -> pax option (flags that take a value).
RENAMED = {
    "--exp": "--exp",
    "--fdl_config": "--exp",
    "--job_log_dir": "--job-dir",
    "--restore_checkpoint_step": "--restore-checkpoint-step",
    "--fdl_config_file": "--fdl-config-file",
    "--server_addr": "--coordinator-address",
    "--num_hosts": "--num-processes",
    "--host_idx": "--process-id",
}
# Pax boolean flag -> (pax option when true, when false).
BOOLEANS = {
    "--eval_on_test": ("--eval-on-test", "--no-eval-on-test"),
}
# Pax flags that do not apply, and why.
OBSOLETE = {
    "--jax_fully_async_checkpoint": "checkpoints are always written in the background",
    "--maybe_use_persistence_checkpointing": "checkpoints are always Orbax's",
    "--jax_array_in_pax": "jax.Array is the only array type",
    "--globally_use_hardware_rng": "random keys are JAX's defaults",
    "--jax_traceback_filtering_option": "set JAX_TRACEBACK_FILTERING instead",
    "--decode_output_pickle": "decode writes JSON lines only",
    "--checkpoint_todelete_subdir": "old checkpoints are deleted",
    "--enable_auto_sharding": "shardings come from the logical axis rules",
    "--multiprocess_gpu": "multi-process runs are detected from the cluster or the options",
    "--alsologtostderr": "pax prints its own lines; libraries log to JOB_DIR/logs",
    "--logtostderr": "pax prints its own lines; libraries log to JOB_DIR/logs",
    "--jax_profiler_port": "use --profile-steps START:END",
    "--decode_during_train": "run pax decode on the job instead",
    "--eval_during_decode": "run pax eval on the job instead",
    "--enable_checkpoint_saving": "a run always saves its checkpoints",
    "--jax_backend_target": "use --platform",
    "--jax_xla_backend": "use --platform",
    "--jax_enable_checks": "set JAX_ENABLE_CHECKS instead",
}
# Flags of Pax's tuning (PyGlove), which is pax sweep here.
TUNING = ("--study", "--controller_mode", "--tuner_group", "--metrics_from", "--num_trials",
          "--pythia_port")
MODES = {"train": "train", "eval": "eval", "decode": "decode", "decode_once": "decode"}
GLOBAL_OPTIONS = ("--plugins", "--disable-plugins")
_BOOLEAN_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _boolean(flag: str, value: str) -> bool:
    try:
        return _BOOLEAN_WORDS[value.lower()]
    except KeyError:
        raise UsageError(f"{flag}={value}: expected true or false") from None


def _is_pax_flag(name: str) -> bool:
    bare = "--" + name[len("--no"):] if name.startswith("--no") else name
    return (name in RENAMED or name == "--mode" or bare in BOOLEANS or bare in OBSOLETE
            or name in TUNING)


def translate(argv: list[str]) -> list[str]:
    """``argv`` with Pax's flags replaced by pax's options (and a subcommand from ``--mode``
    where none is given); notices for the flags that do not apply."""
    out: list[str] = []
    mode: str | None = None
    saw_pax = False
    training_only: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            out += argv[i - 1:]
            break
        name, eq, value = arg.partition("=")
        if arg.startswith("--fdl.") and eq:
            out += ["--set", arg[len("--fdl."):]]
            continue
        if not arg.startswith("--") or not _is_pax_flag(name):
            out.append(arg)
            continue
        saw_pax = saw_pax or name != "--exp"
        takes_value = name in RENAMED or name == "--mode" or name in TUNING
        if takes_value and not eq:
            if i >= len(argv):
                raise UsageError(f"{name} needs a value")
            value, i = argv[i], i + 1
        if name == "--mode":
            if value not in MODES:
                raise UsageError(f"--mode={value} has no counterpart here; pax runs train, "
                                 f"eval and decode (pax train, pax eval, pax decode)")
            mode = MODES[value]
        elif name in RENAMED:
            out += [RENAMED[name], value]
        elif name in TUNING:
            raise UsageError(f"{name} belongs to Pax's tuning, which pax train does not run; "
                             f"tune with pax sweep --exp E --sweep-dir DIR (PyGlove search "
                             f"spaces, --num_trials is --trials), or drop the tuning flags")
        else:
            negated = name.startswith("--no") and name not in BOOLEANS and name not in OBSOLETE
            bare = "--" + name[len("--no"):] if negated else name
            if bare in OBSOLETE:
                warn(f"{bare} is a Pax flag that does not apply here ({OBSOLETE[bare]}); "
                     f"ignored")
            else:
                on = not negated and (_boolean(name, value) if eq else True)
                training_only.append((arg, BOOLEANS[bare][0 if on else 1]))
    if mode is not None or saw_pax:
        out = _with_subcommand(out, mode or "train")  # train is Pax's default mode
    if training_only and _subcommand(out) != "train":
        warn(f"{', '.join(flag for flag, _ in training_only)} applies to training only; "
             f"ignored")
        return out
    return out + [option for _, option in training_only]


def _command_index(argv: list[str]) -> int:
    """Where the subcommand is (or goes): after the global options."""
    start = 0
    while start < len(argv) and argv[start].split("=")[0] in GLOBAL_OPTIONS:
        start += 1 if "=" in argv[start] else 2
    return start


def _subcommand(argv: list[str]) -> str | None:
    start = _command_index(argv)
    return argv[start] if start < len(argv) and not argv[start].startswith("-") else None


def _with_subcommand(argv: list[str], mode: str) -> list[str]:
    """``argv`` with ``mode`` as its subcommand, after the global options (Pax names the mode
    by a flag); a subcommand given as well must agree."""
    start = _command_index(argv)
    if _subcommand(argv) is not None:
        if argv[start] in MODES.values() and argv[start] != mode:
            raise UsageError(f"--mode={mode} contradicts the subcommand {argv[start]}")
        return argv
    return [*argv[:start], mode, *argv[start:]]
