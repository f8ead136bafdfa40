"""The typer application: built-in subcommands plus those plugins register."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core

from pax_core.cli.options import (
    AddressOpt,
    ExpOpt,
    FormatOpt,
    JobDirOpt,
    JsonAliasOpt,
    JsonOpt,
    NumProcessesOpt,
    PlatformOpt,
    PluginOpt,
    ProcessIdOpt,
    RecordedExpOpt,
    RestoreStepOpt,
    SetOpt,
    checked_directory,
    checked_format,
    context_settings,
    summary,
)
from pax_core.errors import RunError, UsageError, warn
from pax_core.plugins.host import PluginHost

# Commands that Pax's own packages add, by the package to install for each: asked for without
# it, the command says so in one line rather than typer's "No such command".
PACKAGED_COMMANDS = {"sweep": "pax-sweep", "decode": "pax-lm", "data": "pax-lm",
                     "tokenizer": "pax-lm", "predict": "pax-vision", "transcribe": "pax-speech",
                     "gpu": "pax-gpu"}


def _host(ctx: typer.Context) -> PluginHost:
    return ctx.find_root().obj


def _show_version(value: bool) -> None:
    """``pax --version``: eager, so it answers before a subcommand is asked for."""
    if value:
        from pax_core import API_VERSION, __version__

        typer.echo(f"pax {__version__} (plugin API {API_VERSION})")
        raise typer.Exit()


def root(
    plugins: Annotated[str | None, typer.Option(
        "--plugins", metavar="A,B",
        help="Load only these plugins (empty: built-ins only). Same as PAX_PLUGINS.")] = None,
    disable_plugins: Annotated[str | None, typer.Option(
        "--disable-plugins", metavar="A,B",
        help="Do not load these plugins. Same as PAX_DISABLE_PLUGINS.")] = None,
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_show_version,
        help="Print the versions of pax-core and of its plugin API, and exit.")] = False,
) -> None:
    """Pax: train large neural networks on JAX, from one CPU to a pod.

    Plugins add models, inputs, experiments and commands: `pax plugins` lists them.
    """


def plugins_command(ctx: typer.Context, fmt: FormatOpt = None,
                    as_json: JsonAliasOpt = False) -> None:
    """List plugins: distribution, version, API range, status, the hooks each implements and
    what each registered. `pax plugins new NAME` starts a new one."""
    if ctx.invoked_subcommand is None:
        from pax_core.cli import listing

        listing.show_plugins(_host(ctx), listing.output_format(fmt, as_json))


def new_plugin_command(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The plugin's name: pax --plugin "
                                        "NAME, package pax_NAME, distribution pax-NAME.")],
    output: Annotated[str | None, typer.Option(
        "--output", "-o", metavar="DIR", help="Where to write it; default ./pax_NAME (must not "
        "exist, or be empty).")] = None,
    modality: Annotated[bool, typer.Option(
        "--modality", help="A model, an input and an experiment (the default).")] = False,
    backend: Annotated[bool, typer.Option(
        "--backend", help="The same plus a backend: runtime settings of a platform.")] = False,
) -> None:
    """Write a complete, working plugin package: pyproject with the entry point and API range,
    plugin.py, a model, an input, an experiment that trains in seconds, tests, README."""
    from pathlib import Path

    from pax_core.plugins import kit

    if modality and backend:
        raise UsageError("--modality and --backend are alternatives; give one")
    target = Path(output) if output else Path(f"pax_{name}")
    written = kit.new_plugin(name, target, backend=backend)
    typer.echo(f"wrote {len(written)} files into {target}:")
    for path in written:
        typer.echo(f"  {path}")
    typer.echo(f"next: pip install -e '{target}[test]' && pytest {target}/tests")


def experiments_command(ctx: typer.Context, plugin: PluginOpt = None, fmt: FormatOpt = None,
                        as_json: JsonAliasOpt = False) -> None:
    """List registered experiments (importing none of them)."""
    from pax_core.cli import listing

    listing.show_experiments(_host(ctx), plugin, listing.output_format(fmt, as_json))


def config_command(
    ctx: typer.Context,
    exp: ExpOpt,
    plugin: PluginOpt = None,
    set_items: SetOpt = None,
    constants: Annotated[bool, typer.Option(
        "--constants", help="List the experiment's UPPER_CASE constants that --set takes, "
        "each with its value (overrides applied) and type, instead of the config.")] = False,
    fmt: Annotated[str | None, typer.Option(
        "--format", metavar="table|tsv|json", callback=checked_format,
        help="json: the config as Fiddle JSON; with --constants also table or tsv (default: "
        "a table on a terminal, tab-separated rows in a pipe).")] = None,
    as_json: JsonAliasOpt = False,
) -> None:
    """Print the resolved configuration of an experiment, overrides applied."""
    from pax_core.cli import listing

    chosen = listing.output_format(fmt, as_json)
    if constants:
        from pax_core.config.resolve import choose_experiment

        picked = choose_experiment(_host(ctx), exp, plugin, set_items or [])
        listing.show_constants(picked.name, type(picked.experiment), chosen)
        return
    if fmt in ("table", "tsv"):
        raise UsageError(f"--format {fmt} goes with --constants; the config prints as text, "
                         f"or as JSON with --format json")
    from pax_core.config.resolve import resolve

    resolved = resolve(_host(ctx), exp, plugin, set_items or [])
    resolved.build()
    typer.echo(resolved.to_json() if chosen == "json" else resolved.to_text(), nl=False)


def train_command(
    ctx: typer.Context,
    job_dir: JobDirOpt,
    exp: RecordedExpOpt = None,
    plugin: PluginOpt = None,
    set_items: SetOpt = None,
    platform: PlatformOpt = None,
    peak_tflops: Annotated[float | None, typer.Option(
        "--peak-tflops", metavar="TFLOPS", min=1e-9,
        help="Peak TFLOP/s of one device for MFU and HFU; default: the device's dense bf16 "
        "figure (TPU, GPU), or a float32 matmul measured once on a CPU.")] = None,
    profile_steps: Annotated[str | None, typer.Option(
        "--profile-steps", metavar="START:END",
        help="Trace steps START to END with jax.profiler into JOB_DIR/profile (TensorBoard's "
        "profile tab, or Perfetto).")] = None,
    restore_step: Annotated[int | None, typer.Option(
        "--restore-checkpoint-step", metavar="STEP", min=0,
        help="Restart from the checkpoint of this step instead of the latest; the later ones "
        "are moved to JOB_DIR/rolled_back_checkpoints.")] = None,
    eval_on_test: Annotated[bool, typer.Option(
        "--eval-on-test/--no-eval-on-test",
        help="Evaluate the eval datasets during training (every eval_interval_steps and at the "
        "end).")] = True,
    config_file: Annotated[str | None, typer.Option(
        "--fdl-config-file", metavar="FILE",
        help="Train this Fiddle JSON config (a job's config.json) in place of the experiment's "
        "task and datasets; the experiment still gives the mesh and components.")] = None,
    init_from: Annotated[str | None, typer.Option(
        "--init-from", metavar="SOURCE",
        help="Start a new job's weights from a job directory, a pax export folder or a "
        "weight format's folder (a Hugging Face one); task.train.init_from_rules map the "
        "names. A resumed job continues from its own checkpoints.")] = None,
    loggers: Annotated[str | None, typer.Option(
        "--loggers", metavar="NAMES",
        help="The metric sinks, comma-separated (console,jsonl,tensorboard, or a plugin's: "
        "pax plugins lists them); default: the experiment's LOGGERS.")] = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="Every metric on the console's step lines, not only the loss, the "
        "eval metric, speed and time.")] = False,
    coordinator_address: AddressOpt = None,
    num_processes: NumProcessesOpt = None,
    process_id: ProcessIdOpt = None,
) -> None:
    """Train an experiment, or resume it from the latest checkpoint in --job-dir."""
    from pax_core.commands import jobs as commands
    from pax_core.parallel.processes import DistributedOptions
    from pax_core.speed.profiling import parse_steps

    window = parse_steps(profile_steps) if profile_steps is not None else None
    distributed = DistributedOptions.parse(coordinator_address, num_processes, process_id)
    set_items = list(set_items or [])
    if init_from is not None:  # a path as the job records it: from anywhere, the same folder
        where = init_from if "://" in init_from else str(Path(init_from).expanduser().resolve())
        set_items.append(f"task.train.init_from={where!r}")
    if loggers is not None:
        names = tuple(name.strip() for name in loggers.split(",") if name.strip())
        set_items.append(f"LOGGERS={names!r}")
    commands.train(_host(ctx), exp=exp, plugin=plugin, set_items=set_items,
                   job_dir=job_dir, platform=platform, distributed=distributed,
                   peak_tflops=peak_tflops, profile_steps=window, restore_step=restore_step,
                   evaluate=eval_on_test, config_file=config_file, verbose=verbose)


def eval_command(
    ctx: typer.Context,
    job_dir: JobDirOpt,
    exp: RecordedExpOpt = None,
    plugin: PluginOpt = None,
    set_items: SetOpt = None,
    platform: PlatformOpt = None,
    as_json: JsonOpt = False,
    restore_step: RestoreStepOpt = None,
    coordinator_address: AddressOpt = None,
    num_processes: NumProcessesOpt = None,
    process_id: ProcessIdOpt = None,
    harness: Annotated[str | None, typer.Option(
        "--harness", metavar="TASKS",
        help="Evaluate with the evaluation harness the job's plugin provides, on these of its "
        "tasks (comma-separated; pax-lm: lm-eval's task names or task YAML files), instead of "
        "the experiment's eval datasets.")] = None,
    harness_limit: Annotated[int | None, typer.Option(
        "--harness-limit", metavar="N", min=1,
        help="With --harness: at most N documents of each task.")] = None,
    num_fewshot: Annotated[int | None, typer.Option(
        "--num-fewshot", metavar="K", min=0,
        help="With --harness: K solved examples before each document (default: each task's "
        "own).")] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", metavar="FILE",
        help="With --harness: write the results (and what the harness reports with them) to "
        "this new JSON file.")] = None,
) -> None:
    """Evaluate the latest checkpoint of a job (or --restore-checkpoint-step) on the
    experiment's eval datasets, or with --harness on an evaluation harness's tasks."""
    import json

    import jax

    from pax_core.commands import jobs as commands
    from pax_core.loggers.console import format_line
    from pax_core.parallel.processes import DistributedOptions

    if harness is not None:
        if coordinator_address or num_processes or process_id:
            raise UsageError("--harness evaluates in one process; drop --coordinator-address, "
                             "--num-processes and --process-id")
        _harness_eval(ctx, harness, job_dir=job_dir, exp=exp, plugin=plugin,
                      set_items=set_items or [], platform=platform, restore_step=restore_step,
                      limit=harness_limit, num_fewshot=num_fewshot, output=output,
                      as_json=as_json)
        return
    given = [n for n, v in (("--harness-limit", harness_limit), ("--num-fewshot", num_fewshot),
                            ("--output", output)) if v is not None]
    if given:
        raise UsageError(f"{', '.join(given)} go{'es' if len(given) == 1 else ''} with "
                         f"--harness TASKS; the eval datasets' results are printed (--json "
                         f"for JSON)")
    distributed = DistributedOptions.parse(coordinator_address, num_processes, process_id)
    step, results = commands.evaluate(_host(ctx), exp=exp, plugin=plugin,
                                      set_items=set_items or [], job_dir=job_dir,
                                      platform=platform, distributed=distributed,
                                      step=restore_step)
    if jax.process_index() != 0:  # every process has the same results: print them once
        return
    if as_json:
        typer.echo(json.dumps({"step": step, "eval": results}, indent=1))
        return
    for name, metrics in results.items():
        typer.echo(format_line(step, f"eval/{name}", metrics))


def _harness_eval(ctx: typer.Context, harness: str, *, job_dir: str, exp: str | None,
                  plugin: str | None, set_items: list[str], platform: str | None,
                  restore_step: int | None, limit: int | None, num_fewshot: int | None,
                  output: Path | None, as_json: bool) -> None:
    """``pax eval --harness TASKS``: the job through its plugin's harness (which checks its
    tasks before it restores the job), the results printed and written to ``output``."""
    import json

    from pax_core.cli.job_commands import JobRequest
    from pax_core.commands.jobs import harness_for
    from pax_core.files import write_atomic
    from pax_core.loggers.console import format_line

    tasks = list(dict.fromkeys(t.strip() for t in harness.split(",") if t.strip()))
    if not tasks:
        raise UsageError("--harness names no task; give one or more, comma-separated")
    if output is not None:
        if not output.parent.is_dir():
            raise UsageError(f"--output {output}: no such folder {output.parent}")
        if output.exists():
            raise UsageError(f"--output {output} exists; name a new file (nothing was "
                             f"evaluated)")
    host = _host(ctx)
    entry = harness_for(host, exp=exp, plugin=plugin, set_items=set_items, job_dir=job_dir)
    job = JobRequest(host, job_dir, plugin, exp, set_items, platform, restore_step)
    report = entry.load()(job, tasks, limit=limit, num_fewshot=num_fewshot)
    if not (isinstance(report, dict) and isinstance(report.get("step"), int)
            and isinstance(report.get("results"), dict)):
        raise RunError(f"harness '{entry.qualified_name}' (plugin '{entry.plugin}') returned no "
                       f"step and results: {str(report)[:120]}")
    report = {"harness": entry.qualified_name, **report}
    text = json.dumps(report, indent=1)
    if output is not None:
        write_atomic(output, text + "\n")
    if as_json:
        typer.echo(text)
        return
    for task, metrics in report["results"].items():
        typer.echo(format_line(report["step"], f"{entry.name}/{task}", metrics))
    if output is not None:
        typer.echo(f"wrote the results to {output}")


def export_command(
    ctx: typer.Context,
    job_dir: JobDirOpt,
    output: Annotated[str, typer.Option(
        "--output", "-o", metavar="DIR", callback=checked_directory,
        help="A new directory for params/, config.json and export.json.")],
    exp: RecordedExpOpt = None,
    plugin: PluginOpt = None,
    set_items: SetOpt = None,
    restore_step: RestoreStepOpt = None,
    platform: PlatformOpt = None,
    as_json: JsonOpt = False,
    format_name: Annotated[str | None, typer.Option(
        "--format", "-f", metavar="FORMAT",
        help="Write the weights in a registered weight format's layout (hf: a Hugging Face "
        "folder, from pax-lm) instead of an Orbax checkpoint.")] = None,
) -> None:
    """Write the parameters of a job's latest checkpoint (or --restore-checkpoint-step), without
    optimizer state, to a new directory: for serving, or for another framework."""
    import json

    import jax

    from pax_core.commands import export

    record = export.export_params(_host(ctx), job_dir=job_dir, output=output, exp=exp,
                                  plugin=plugin, set_items=set_items or [], step=restore_step,
                                  platform=platform, format_name=format_name)
    if jax.process_index() == 0:
        typer.echo(json.dumps(record, indent=1) if as_json else
                   f"exported step {record['step']} of {record['experiment']} "
                   f"({record['num_params']} parameters) to {output}")


def import_command(
    ctx: typer.Context,
    format_name: Annotated[str, typer.Argument(
        metavar="FORMAT", help="A registered weight format (hf: a Hugging Face folder, from "
        "pax-lm).")],
    source: Annotated[str, typer.Argument(
        metavar="SOURCE", help="The folder (or file) to import.")],
    output: Annotated[str, typer.Option(
        "--output", "-o", metavar="JOB_DIR", callback=checked_directory,
        help="A new job directory.")],
    exp: Annotated[str | None, typer.Option(
        "--exp", "-e", metavar="EXPERIMENT",
        help="The experiment the weights belong to, for a format whose files do not say.")]
    = None,
    set_items: SetOpt = None,
    platform: PlatformOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Import another framework's model as a new job directory: its configuration, its
    weights as step 0 and its tokenizer, ready for pax train, eval and decode."""
    import json

    from pax_core.commands import import_weights

    record = import_weights.import_job(_host(ctx), format_name=format_name, source=source,
                                       output=output, exp=exp, set_items=set_items or [],
                                       platform=platform)
    typer.echo(json.dumps(record, indent=1) if as_json else
               f"imported {record['description']} ({record['num_params']:,} parameters) as "
               f"{record['experiment']} into {record['job_dir']}")


def plan_command(
    ctx: typer.Context,
    exp: ExpOpt,
    plugin: PluginOpt = None,
    set_items: SetOpt = None,
    hbm_gib: Annotated[float | None, typer.Option(
        "--hbm-gib", metavar="GIB", show_default=False,
        help="Memory of one device (above 0), to say whether it fits [default: the target "
        "chip's, else 32].")] = None,
    devices: Annotated[int, typer.Option(
        "--devices", metavar="N",
        help="Devices (1 or more) for an experiment that declares no mesh (Pax's "
        "data-parallel path).")] = 8,
    target: Annotated[str | None, typer.Option(
        "--target", metavar="TARGET", show_default=False,
        help="Hardware to predict the step on: a chip and its count, as v5p-256, v6e-64, "
        "h100-64 (v4 and v5p count TensorCores, the others chips or GPUs).")] = None,
    slices: Annotated[int, typer.Option(
        "--slices", metavar="N", help="TPU slices of the --target, joined by DCN.")] = 1,
    hardware: Annotated[list[str] | None, typer.Option(
        "--hardware", metavar="FILE", show_default=False,
        help="A chip's TOML file (or a folder of them) to add to the catalogue; "
        "repeatable.")] = None,
    search: Annotated[bool, typer.Option(
        "--search", help="Rank the meshes that fill the --target by predicted step time.")]
    = False,
    vary: Annotated[list[str] | None, typer.Option(
        "--vary", metavar="NAME=A,B", show_default=False,
        help="With --search, also try each value of a constant (e.g. "
        "CHECKPOINT_POLICY=SAVE_NOTHING,SAVE_DOT_ONLY); repeatable.")] = None,
    search_limit: Annotated[int, typer.Option(
        "--search-limit", metavar="N", min=1,
        help="With --search, the most candidates to compile (each takes seconds).")] = 64,
    fmt: FormatOpt = None,
    as_json: JsonAliasOpt = False,
) -> None:
    """Compile an experiment on fake CPU devices of its mesh: parameters, FLOPs, memory per
    device; with --target, its predicted step time and MFU on that hardware."""
    from pax_core.cli import listing
    from pax_core.commands import plan as planning
    from pax_core.speed.hardware import parse_target

    planning.check_sizes(devices, 32.0 if hbm_gib is None else hbm_gib)
    chosen = listing.output_format(fmt, as_json)
    if search and target is None:
        raise UsageError("--search ranks meshes for a --target; add --target, e.g. v5p-256")
    if (vary or search_limit != 64) and not search:
        raise UsageError("--vary and --search-limit go with --search; add --search")
    hw = parse_target(target, slices, hardware or []) if target else None
    if hw is None and (slices != 1 or hardware):
        raise UsageError("--slices and --hardware describe a --target; add --target, "
                         "e.g. v5p-256")
    host = _host(ctx)
    if search:
        from pax_core.commands import plan_search

        candidates = plan_search.choices(host, exp=exp, plugin=plugin,
                                         set_items=set_items or [], target=hw,
                                         vary=vary or [], limit=search_limit)
        planning.use_fake_devices(hw.chips)
        found = plan_search.search(host, exp=exp, plugin=plugin, set_items=set_items or [],
                                   target=hw, candidates=candidates, hbm_gib=hbm_gib)
        listing.show_search(found, chosen)
        return
    planning.use_fake_devices(planning.devices_needed(host, exp, plugin, set_items or [],
                                                      devices, hw))
    result = planning.plan(host, exp=exp, plugin=plugin, set_items=set_items or [],
                           hbm_gib=hbm_gib, target=hw)
    listing.show_plan(result, chosen)


def plot_command(
    job_dirs: Annotated[list[str], typer.Argument(
        metavar="JOB_DIR", help="Jobs to draw, one colour each.", show_default=False)],
    output: Annotated[str, typer.Option(
        "--output", "-o", metavar="FILE",
        help="The picture to write (.png, .svg or .pdf); replaced if it exists.")],
    metrics: Annotated[list[str] | None, typer.Option(
        "--metric", "-m", metavar="METRIC",
        help="A metric to draw, one panel each (repeat the option): a name (loss, accuracy: "
        "train and every eval dataset) or KIND NAME ('eval/test accuracy'); default: the loss "
        "and the runs' eval metric.")] = None,
) -> None:
    """Draw jobs' metrics against the step into one picture (from each job's metrics.jsonl),
    to compare runs."""
    from pax_core.commands.plot import plot_jobs

    drawn = plot_jobs(job_dirs, output, metrics or [])
    typer.echo(f"wrote {', '.join(drawn)} of {len(job_dirs)} job(s) to {output}")


def launch_command(
    ctx: typer.Context,
    command: Annotated[list[str] | None, typer.Argument(
        metavar="COMMAND", help="After --, what every process runs: pax train ...",
        show_default=False)] = None,
    processes: Annotated[str | None, typer.Option(
        "--processes", "-n", metavar="N", show_default=False,
        help="On this machine: how many processes to start.")] = None,
    cpu_devices: Annotated[str | None, typer.Option(
        "--cpu-devices", metavar="M",
        help="With --processes: run on the CPU with M devices per process (JAX_PLATFORMS=cpu "
        "and XLA's host device count).")] = None,
    bind: Annotated[str, typer.Option(
        "--bind", metavar="HOST",
        help="With --processes: where process 0's coordinator listens: 127.0.0.1 (only this "
        "machine reaches it), or another address of this machine; 0.0.0.0 or :: for every "
        "interface.")] = "127.0.0.1",
    tpu: Annotated[str | None, typer.Option(
        "--tpu", metavar="NAME", show_default=False,
        help="On a Cloud TPU through gcloud: the TPU's name (NAME-0 ... with --slices).")]
    = None,
    zone: Annotated[str | None, typer.Option(
        "--zone", metavar="ZONE", show_default=False, help="With --tpu: its zone.")] = None,
    project: Annotated[str | None, typer.Option(
        "--project", metavar="PROJECT", show_default=False,
        help="With --tpu: its Google Cloud project (default: gcloud's).")] = None,
    slices: Annotated[int, typer.Option(
        "--slices", metavar="N", min=1, help="With --tpu or --k8s: TPU slices.")] = 1,
    create: Annotated[str | None, typer.Option(
        "--create", metavar="ACCELERATOR", show_default=False,
        help="With --tpu: queue the slices first, of this accelerator type (e.g. v4-128).")]
    = None,
    runtime: Annotated[str | None, typer.Option(
        "--runtime", metavar="VERSION", show_default=False,
        help="With --create: the TPU software version.")] = None,
    install: Annotated[str | None, typer.Option(
        "--install", metavar="REQUIREMENT", show_default=False,
        help="With --tpu: pip install this on every worker first (default: check that each "
        "runs this machine's Pax).")] = None,
    slurm: Annotated[bool, typer.Option(
        "--slurm", help="As a SLURM job: an sbatch script, submitted and followed.")] = False,
    partition: Annotated[str | None, typer.Option(
        "--partition", metavar="P", show_default=False, help="With --slurm: its partition.")]
    = None,
    nodes: Annotated[int, typer.Option(
        "--nodes", metavar="N", min=1, help="With --slurm or --k8s: nodes (pods).")] = 1,
    gpus_per_node: Annotated[int | None, typer.Option(
        "--gpus-per-node", metavar="G", min=1, show_default=False,
        help="With --slurm or --k8s: GPUs each node gets.")] = None,
    tasks_per_node: Annotated[int | None, typer.Option(
        "--tasks-per-node", metavar="T", min=1, show_default=False,
        help="With --slurm: processes a node (default: one a GPU, else one).")] = None,
    time_limit: Annotated[str | None, typer.Option(
        "--time", metavar="LIMIT", show_default=False,
        help="With --slurm: the job's time limit, in SLURM's format.")] = None,
    account: Annotated[str | None, typer.Option(
        "--account", metavar="ACCOUNT", show_default=False,
        help="With --slurm: the account to charge.")] = None,
    sbatch_args: Annotated[list[str] | None, typer.Option(
        "--sbatch-arg", metavar="ARG", show_default=False,
        help="With --slurm: another #SBATCH line, e.g. --qos=high; repeatable.")] = None,
    k8s: Annotated[bool, typer.Option(
        "--k8s", help="As a Kubernetes JobSet, applied with kubectl and followed.")] = False,
    image: Annotated[str | None, typer.Option(
        "--image", metavar="IMAGE", show_default=False,
        help="With --k8s: the container image with Pax (docker/README.md).")] = None,
    accelerator: Annotated[str | None, typer.Option(
        "--accelerator", metavar="TYPE", show_default=False,
        help="With --k8s: the node pool's accelerator, GKE's label (tpu-v5p-slice, "
        "nvidia-h100-80gb); none: CPU pods.")] = None,
    topology: Annotated[str | None, typer.Option(
        "--topology", metavar="SHAPE", show_default=False,
        help="With --k8s on TPUs: a slice's topology, e.g. 2x2x2.")] = None,
    namespace: Annotated[str, typer.Option(
        "--namespace", metavar="NS", help="With --k8s: the namespace.")] = "default",
    name: Annotated[str, typer.Option(
        "--name", metavar="NAME", help="With --k8s: the JobSet's name; with --slurm: the "
        "job's.")] = "pax",
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="With --tpu, --slurm or --k8s: print what it would run (commands, "
        "script or manifests), run nothing.")] = False,
) -> None:
    """Run one command as the processes of a multi-process run: on this machine, on Cloud TPU
    slices, as a SLURM job or as a Kubernetes JobSet.

    On this machine (--processes N), for development and tests: each process gets the
    coordinator address (127.0.0.1 and a free port, where process 0's coordinator listens;
    --bind to listen elsewhere), the process count and its index, and its output is prefixed
    with [p<i>]. When one fails, the others are stopped; the exit code is the first failure's.
    The cluster launchers are in the guide "Running on clusters".
    """
    modes = [flag for flag, on in (("--processes", processes is not None),
                                   ("--tpu", tpu is not None), ("--slurm", slurm),
                                   ("--k8s", k8s)) if on]
    if len(modes) != 1:
        raise UsageError("pax launch runs on this machine (--processes N), Cloud TPU (--tpu "
                         "NAME), SLURM (--slurm) or Kubernetes (--k8s): give "
                         f"{'one' if not modes else 'one of ' + ', '.join(modes)}")
    belongs = {"--cpu-devices": ("--processes", cpu_devices is not None),
               "--bind": ("--processes", bind != "127.0.0.1"),
               "--zone": ("--tpu", zone is not None), "--project": ("--tpu", project is not None),
               "--create": ("--tpu", create is not None),
               "--runtime": ("--tpu", runtime is not None),
               "--install": ("--tpu", install is not None),
               "--partition": ("--slurm", partition is not None),
               "--tasks-per-node": ("--slurm", tasks_per_node is not None),
               "--time": ("--slurm", time_limit is not None),
               "--account": ("--slurm", account is not None),
               "--sbatch-arg": ("--slurm", bool(sbatch_args)),
               "--image": ("--k8s", image is not None),
               "--accelerator": ("--k8s", accelerator is not None),
               "--topology": ("--k8s", topology is not None),
               "--namespace": ("--k8s", namespace != "default"),
               "--slices": ("--tpu --k8s", slices != 1),
               "--nodes": ("--slurm --k8s", nodes != 1),
               "--gpus-per-node": ("--slurm --k8s", gpus_per_node is not None),
               "--name": ("--slurm --k8s", name != "pax"),
               "--dry-run": ("--tpu --slurm --k8s", dry_run)}
    for option, (owners, given) in belongs.items():
        if given and modes[0] not in owners.split():
            raise UsageError(f"{option} goes with {' or '.join(owners.split())}, not "
                             f"{modes[0]}; drop it")
    command = command or []
    if processes is not None:
        from pax_core.launchers import local
        from pax_core.parallel.processes import parse_count

        count = parse_count(processes, "--processes", 1)
        devices = (parse_count(cpu_devices, "--cpu-devices", 1) if cpu_devices is not None
                   else None)
        raise typer.Exit(local.launch(command, count, devices, bind))
    if tpu is not None or (k8s and (accelerator or "").startswith("tpu")):
        from pax_core.launchers.checks import check_slices

        check_slices(_host(ctx), command, slices)
    if tpu is not None:
        from pax_core.launchers import cloud_tpu

        raise typer.Exit(cloud_tpu.launch(command, cloud_tpu.TpuOptions(
            tpu, zone, project, slices, create, runtime, install), dry_run))
    if slurm:
        from pax_core.launchers import slurm as slurm_launcher

        raise typer.Exit(slurm_launcher.launch(command, slurm_launcher.SlurmOptions(
            partition, nodes, gpus_per_node, tasks_per_node, time_limit, account,
            tuple(sbatch_args or ()), name), dry_run))
    from pax_core.launchers import kubernetes

    raise typer.Exit(kubernetes.launch(command, kubernetes.KubernetesOptions(
        image, accelerator, topology, slices, nodes, gpus_per_node, namespace, name), dry_run))


def _not_installed(app: typer.Typer, name: str, package: str) -> None:
    """A hidden stand-in for ``pax NAME`` whose package is not installed."""

    @app.command(name=name, hidden=True, add_help_option=False,
                 context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def missing() -> None:
        raise UsageError(f"pax {name} comes with {package}, which is not installed (or is "
                         f"disabled): pip install {package}")


def _plugin_command(app: typer.Typer, host: PluginHost, name: str, help_text: str,
                    hidden: bool = False) -> None:
    """Add ``name`` as a stand-in that resolves and imports the plugin's command only when it
    runs; an ambiguous name fails then with the error that names both plugins."""

    @app.command(
        name=name,
        help=help_text,
        short_help=help_text,
        hidden=hidden,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                          "help_option_names": []},
        add_help_option=False,
    )
    def run(ctx: typer.Context) -> None:
        command = as_command(host.components("commands").get(name).load())
        # The plugin's own app: its contexts start from pax's settings (-h, the width).
        command.main(args=ctx.args, prog_name=f"pax {name}", obj=ctx.find_root().obj,
                     **context_settings())


Command = typer.core.TyperCommand | typer.core.TyperGroup


def as_command(target: typer.Typer | Callable[..., Any]) -> Command:
    """A plugin's registered command (a typer app, or a function) as ``pax`` runs it: every
    argument, and every option that takes a value, that names no metavar is shown by its name
    in capitals (``--max-tokens MAX_TOKENS``), pax's style, rather than by its type (``INTEGER
    RANGE``) or in lower case."""
    command = typer.main.get_command(target if isinstance(target, typer.Typer)
                                     else _as_app(target))
    for each in walk(command):
        for param in each.params:
            if takes_metavar(param) and param.metavar is None:
                param.metavar = param.name.upper()
    return command


def takes_metavar(param: Any) -> bool:
    """Whether ``param`` shows a metavar: an argument, or an option that takes a value (not a
    flag or a count)."""
    return param.param_type_name == "argument" or (
        param.param_type_name == "option" and not getattr(param, "is_flag", False)
        and not getattr(param, "count", False))


def walk(command: Command) -> list[Command]:
    """``command`` and, for a group, every command under it."""
    found = [command]
    for sub in getattr(command, "commands", {}).values():
        found += walk(sub)
    return found


def _as_app(function: Callable[..., Any]) -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                      rich_markup_mode=None, context_settings=context_settings())
    app.command(short_help=summary(function))(function)
    return app


BUILTIN: dict[str, Callable[..., Any]] = {
    "experiments": experiments_command, "config": config_command, "train": train_command,
    "eval": eval_command, "export": export_command, "import": import_command,
    "plan": plan_command, "launch": launch_command, "plot": plot_command,
}


def build_app(host: PluginHost) -> typer.Typer:
    """The ``pax`` app: the built-in commands, and a stand-in for each plugin command that
    imports it only when it runs (``pax --help`` lists them from their registrations)."""
    app = typer.Typer(add_completion=True, no_args_is_help=True,
                      pretty_exceptions_enable=False, rich_markup_mode=None,
                      context_settings=context_settings())
    app.callback()(root)
    plugins_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                              rich_markup_mode=None)
    plugins_app.callback(invoke_without_command=True)(plugins_command)
    plugins_app.command("new", short_help=summary(new_plugin_command))(new_plugin_command)
    app.add_typer(plugins_app, name="plugins", short_help=summary(plugins_command))
    for name, function in BUILTIN.items():
        # Everything after the first word of COMMAND is the command's own, options included.
        settings = {"allow_interspersed_args": False} if name == "launch" else None
        app.command(name, short_help=summary(function), context_settings=settings)(function)
    builtin = {"plugins", *BUILTIN}
    commands = host.components("commands")
    conflicts = commands.conflicts()
    for entry in commands:
        if entry.name in builtin:
            warn(f"plugin '{entry.plugin}' registers a command '{entry.name}', which is built in; "
                 f"it is ignored")
            continue
        _plugin_command(app, host, entry.qualified_name, entry.component.help, hidden=True)
        if entry.name in conflicts:
            if entry is conflicts[entry.name][0]:
                owners = ", ".join(e.qualified_name for e in conflicts[entry.name])
                _plugin_command(app, host, entry.name, f"ambiguous: use one of {owners}")
        else:
            _plugin_command(app, host, entry.name,
                            entry.component.help or f"(from plugin {entry.plugin})")
    registered = {entry.name for entry in commands}
    for name, package in PACKAGED_COMMANDS.items():
        if name not in registered:
            _not_installed(app, name, package)
    return app
