"""The ``ember`` command: ``train``, ``lr-find``, ``launch``, ``resume``, ``verify-resume``, ``inspect``, ``plot``..."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ember.cli._config import ConfigError, config_from, source_of
from ember.cli._distributed import end_together, first_process, missing_processes, start_distributed
from ember.cli._early_signals import StoppedBeforeTraining, noting_signals
from ember.cli._launch import RESUMABLE, statuses
from ember.errors import ProcessesMissing, RunHeldError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ember`` command line; return the exit status.

    Examples:
        >>> from ember.cli import main
        >>> main(["--version"])  # doctest: +ELLIPSIS
        ember ...
        0
    """
    from ember import __version__

    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command in ("train", "lr-find", "plan") and not any(x.startswith("-") for x in extra):
        args.config = [*args.config, *extra]  # overrides may come anywhere on the line, after --output too
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.version:
        print(f"ember {__version__}")
        return 0
    command = _COMMANDS.get(args.command)
    if command is None:
        parser.print_help()
        return 2
    try:
        return command(args)
    except (ConfigError, FileNotFoundError, ValueError, ImportError) as e:
        if getattr(args, "debug", False) or os.environ.get("EMBER_DEBUG", "") not in ("", "0"):
            raise  # the whole traceback, for a bug report
        print(f"ember: error: {e}", file=sys.stderr)
        return 2
    except RunHeldError as e:  # another launch writes this run: try again once it has ended
        from ember._multiprocess import REQUEUE_STATUS

        print(f"ember: {e}", file=sys.stderr)
        return REQUEUE_STATUS
    except StoppedBeforeTraining as e:  # noted while JAX imported or the run was built: stopped at a safe point
        print(f"ember: stopped ({e.words}) before training started; run the same command to resume.", file=sys.stderr)
        return e.status
    except KeyboardInterrupt:  # Ctrl-C pressed twice, or in another command: during training, the run saves and stops
        print("ember: interrupted (Ctrl-C); nothing was saved since the last checkpoint.", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    """The ``ember`` command's parser: one subparser per subcommand."""
    parser = argparse.ArgumentParser(prog="ember", description="An event-driven training engine for JAX.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (as EMBER_DEBUG=1 does), not one line"
    )
    _add_config_commands(sub, common)
    _add_run_commands(sub, common)
    _add_reading_commands(sub, common)
    return parser


def _add_config_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """The subcommands that read a config: train, lr-find, plan, verify-resume."""
    p_train = sub.add_parser("train", parents=[common], help="train from a YAML config (none: the embedded digits run)")
    p_train.add_argument(
        "config",
        nargs="*",
        metavar="[CONFIG] [KEY=VALUE ...]",
        help="a YAML config file, then overrides such as trainer.max_epochs=3 optimizer.learning_rate=1e-3",
    )
    p_train.add_argument("--output", help="the run folder (overrides the config's output)")
    p_train.add_argument(
        "--distributed",
        action="store_true",
        help="start jax.distributed first: from EMBER_COORDINATOR, EMBER_NUM_PROCESSES and EMBER_PROCESS_ID "
        "when set, else JAX's own detection (Slurm, Open MPI, TPU)",
    )
    p_lr = sub.add_parser(
        "lr-find", parents=[common], help="the learning-rate range test on a config's model, optimizer and data"
    )
    p_lr.add_argument("config", nargs="*", metavar="[CONFIG] [KEY=VALUE ...]", help="as for ember train")
    p_lr.add_argument("--start", type=float, default=1e-7, help="the first learning rate (default 1e-7)")
    p_lr.add_argument("--end", type=float, default=10.0, help="the last learning rate (default 10)")
    p_lr.add_argument("--num-iter", type=int, default=100, help="steps at most (default 100)")
    p_lr.add_argument("--output", help="a PNG of the curve")
    p_plan = sub.add_parser(
        "plan", parents=[common], help="compile a config's steps ahead of time: memory per device, FLOPs, fits or not"
    )
    p_plan.add_argument("config", nargs="*", metavar="[CONFIG] [KEY=VALUE ...]", help="as for ember train")
    p_plan.add_argument(
        "--memory", type=parse_bytes, help="the memory budget per device, e.g. 8GiB (default: the device's limit)"
    )
    p_plan.add_argument("--max-batch", action="store_true", help="search the largest global batch that fits")
    p_plan.add_argument(
        "--multiple-of", type=int, default=8, help="--max-batch tries multiples of this per device (default 8)"
    )
    p_verify = sub.add_parser(
        "verify-resume",
        parents=[common],
        help="train a config straight, then SIGKILLed and relaunched, and check the two end equal",
    )
    p_verify.add_argument("config", nargs="*", metavar="[CONFIG] [KEY=VALUE ...]", help="as ember train takes them")
    p_verify.add_argument(
        "--steps",
        type=int,
        help="iterations of each run (default: two epochs and a quarter, so the relaunch resumes past an epoch's end)",
    )
    p_verify.add_argument("--workdir", help="where the runs go (default: a temporary folder, removed if they match)")
    p_verify.add_argument("--keep", action="store_true", help="keep the runs' folders even when they match")


def _add_run_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """The subcommands that read a run folder or a checkpoint, and launch."""
    p_launch = sub.add_parser(
        "launch",
        help="run N local processes of COMMAND as one distributed run (coordinator set; output prefixed [i])",
    )
    p_launch.add_argument("-n", "--nproc", type=int, required=True, help="how many processes")
    p_launch.add_argument("--port", type=int, help="the coordinator's port on localhost (default: a free one)")
    p_launch.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="relaunch every process when the run ends resumable (--restart-on), up to this many times (default 0)",
    )
    p_launch.add_argument(
        "--restart-on",
        type=statuses,
        default=RESUMABLE,
        metavar="STATUSES",
        help="the exit statuses that are restarted, separated by commas (default 75,143: a process lost, preempted)",
    )
    p_launch.add_argument(
        "--backoff", type=float, default=0.0, help="seconds between a run's end and its restart (default 0)"
    )
    p_launch.add_argument("program", nargs=argparse.REMAINDER, metavar="[--] COMMAND ...")
    p_resume = sub.add_parser(
        "resume", parents=[common], help="continue the run in RUN_DIR with the config saved there"
    )
    p_resume.add_argument("run_dir")
    p_eval = sub.add_parser(
        "eval", parents=[common], help="evaluate a checkpoint of the run in RUN_DIR with its config's evaluations"
    )
    p_eval.add_argument("run_dir")
    p_eval.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="changes to the run's config")
    p_eval.add_argument("--checkpoint", default="latest", help="latest (default), best, or a step")
    p_eval.add_argument(
        "--watch", action="store_true", help="evaluate every checkpoint of the run once, in order, until it ends"
    )
    p_eval.add_argument("--name", default="watch", help="--watch: its records go to RUN_DIR/eval/NAME (default watch)")
    p_eval.add_argument("--poll", type=float, default=2.0, help="--watch: seconds between looks (default 2)")
    p_eval.add_argument(
        "--distributed", action="store_true", help="start jax.distributed first, as ember train --distributed does"
    )


def _add_reading_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """The subcommands that read a run's checkpoints and records: export, inspect, goodput, plot."""
    p_export = sub.add_parser(
        "export", parents=[common], help="write the weights of a checkpoint of RUN_DIR: msgpack, safetensors, orbax"
    )
    p_export.add_argument("run_dir")
    p_export.add_argument(
        "output", help="the file: .msgpack (Flax's) or .safetensors, by its extension; a new folder with --format orbax"
    )
    p_export.add_argument(
        "--format", choices=("msgpack", "safetensors", "orbax"), help="the format (default: OUTPUT's extension)"
    )
    p_export.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="changes to the run's config")
    p_export.add_argument("--checkpoint", default="latest", help="latest (default), best, or a step")
    p_export.add_argument(
        "--take", choices=("params", "model"), default="params", help="params (default), or model: its state too"
    )
    p_export.add_argument("--ema", action="store_true", help="the parameters' moving average (optimizer.ema)")
    p_inspect = sub.add_parser("inspect", parents=[common], help="print what a checkpoint holds")
    p_inspect.add_argument("checkpoint", help="a checkpoint folder, or a folder of checkpoints (its latest)")
    p_goodput = sub.add_parser(
        "goodput", parents=[common], help="where a run's wall time went over every relaunch, and its goodput"
    )
    p_goodput.add_argument("run_dir")
    p_plot = sub.add_parser("plot", parents=[common], help="draw a run's curves into a PNG")
    p_plot.add_argument("run_dir")
    p_plot.add_argument("--output", help="the PNG (default RUN_DIR/curves.png)")


def _train(args: argparse.Namespace) -> int:
    config = config_from(args.config, "train")
    if args.output:
        config.output = args.output
    if _answered_without_training(config, say=not args.distributed or first_process()):
        return 0  # every process of a finished run answers at once, without starting jax.distributed
    with noting_signals():  # a Ctrl-C or SIGTERM before training starts: one line, and the run resumes later
        from ember.cli._train import train  # JAX from here on

        if args.distributed:
            start_distributed()
        try:
            status = _status(train(config, source=source_of(args.config)))
        except ProcessesMissing as e:  # a wait outside the trainer's run (its end) ran out: name them, exit 75
            missing_processes(e)
    if args.distributed:
        end_together(status)
    return status


def _lr_find(args: argparse.Namespace) -> int:
    from ember.cli._lr_find import find_learning_rate

    config = config_from(args.config, "lr-find")
    result = find_learning_rate(
        config, start_lr=args.start, end_lr=args.end, num_iter=args.num_iter, output=args.output
    )
    print(f"suggested learning rate: {result.suggestion:.3g} ({len(result.lrs)} steps tried)")
    if args.output:
        print(f"the curve: {args.output}")
    rerun = " ".join(["ember train", *args.config, f"optimizer.learning_rate={result.suggestion:.3g}"])
    print(f"to train with it: {rerun}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from ember.cli._plan import plan_run

    config = config_from(args.config, "plan")
    print(plan_run(config, memory=args.memory, max_batch=args.max_batch, multiple_of=args.multiple_of))
    return 0


def _launch(args: argparse.Namespace) -> int:
    from ember.cli._launch import launch

    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    return launch(
        args.nproc,
        program,
        port=args.port,
        max_restarts=args.max_restarts,
        restart_on=args.restart_on,
        backoff=args.backoff,
    )


def _resume(args: argparse.Namespace) -> int:
    saved = Path(args.run_dir) / "config.yaml"
    if not saved.exists():
        raise FileNotFoundError(f"{args.run_dir} has no config.yaml; is it a run folder of ember train?")
    config = config_from([str(saved)], "resume")
    config.output = args.run_dir  # this folder, wherever the command runs: not the saved (relative) output
    if _answered_without_training(config):
        return 0
    with noting_signals():
        from ember.cli._train import train  # JAX from here on

        return _status(train(config, source=source_of([str(saved)])))


def _verify_resume(args: argparse.Namespace) -> int:
    from ember.cli._verify_resume import verify_resume

    config_from(args.config, "verify-resume")  # a mistake in it is said now, not by three runs
    try:
        verdict = verify_resume(args.config, steps=args.steps, workdir=args.workdir, keep=args.keep)
    except RuntimeError as e:
        print(f"ember verify-resume: {e}", file=sys.stderr)
        return 1
    print("\n".join(verdict.lines))
    return 0 if verdict.exact else 1


def _printed(table: Callable[[argparse.Namespace], object]) -> Callable[[argparse.Namespace], int]:
    """A subcommand that prints what ``table`` gives and succeeds."""

    def command(args: argparse.Namespace) -> int:
        print(table(args))
        return 0

    return command


def _inspect(args: argparse.Namespace) -> str:
    from ember.cli._checkpoint_contents import describe_checkpoint

    return describe_checkpoint(args.checkpoint)


def _eval(args: argparse.Namespace) -> int:
    from ember.cli._evaluations.job import evaluate_run  # JAX from here on
    from ember.cli._evaluations.watcher import watch_run

    bad = [item for item in args.overrides if "=" not in item]
    if bad:
        raise ConfigError(f"ember eval takes RUN_DIR then KEY=VALUE overrides; {bad[0]!r} is not one.")
    if args.poll <= 0:
        raise ValueError(f"`--poll` must be a positive number of seconds, got {args.poll}.")
    if args.distributed:
        start_distributed()
    if args.watch:
        done = watch_run(args.run_dir, args.name, args.overrides, poll=args.poll)
        damaged = [s for s in done["missed"] if str(s) in done.get("damaged", {})]
        deleted = [s for s in done["missed"] if s not in damaged]
        missed = f"; deleted before they were evaluated: {deleted}" if deleted else ""
        missed += f"; damaged, not evaluated: {damaged}" if damaged else ""
        if not args.distributed or _process_index() == 0:
            print(f"The run has ended: {len(done['evaluated'])} checkpoints evaluated{missed}.")
    else:
        evaluate_run(args.run_dir, args.checkpoint, args.overrides)
    if args.distributed:
        end_together(0)
    return 0


def _process_index() -> int:
    import jax

    return jax.process_index()


def _export(args: argparse.Namespace) -> str:
    from ember.cli._checkpoint_contents import export_weights  # JAX from here on

    bad = [item for item in args.overrides if "=" not in item]
    if bad:
        raise ConfigError(f"ember export takes RUN_DIR OUTPUT then KEY=VALUE overrides; {bad[0]!r} is not one.")
    return export_weights(args.run_dir, args.output, args.checkpoint, args.take, args.overrides, args.format, args.ema)


def _goodput(args: argparse.Namespace) -> str:
    from ember.cli._goodput import goodput_table

    return goodput_table(args.run_dir)


def _plot(args: argparse.Namespace) -> object:
    from ember.cli._plot import plot_run

    return plot_run(args.run_dir, args.output)


#: each subcommand's function, by name: it returns the exit status
_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "train": _train,
    "lr-find": _lr_find,
    "plan": _plan,
    "launch": _launch,
    "resume": _resume,
    "eval": _eval,
    "verify-resume": _verify_resume,
    "export": _printed(_export),
    "inspect": _printed(_inspect),
    "goodput": _printed(_goodput),
    "plot": _printed(_plot),
}


_UNITS = {
    **{"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12},
    **{"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40},
}


def parse_bytes(text: str) -> int:
    """Bytes from ``"8GiB"``, ``"512MiB"``, ``"2GB"`` or ``"1000000"`` (``ember plan --memory``).

    Examples:
        >>> from ember.cli._main import parse_bytes
        >>> parse_bytes("8GiB"), parse_bytes("1.5 kB"), parse_bytes("64")
        (8589934592, 1500, 64)
    """
    number = text.strip().rstrip("bBiIkKmMgGtT ")
    unit = text.strip()[len(number) :].strip().lower()
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(
            f"expected a size such as 8GiB, 512MiB, 2GB or a number of bytes, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a size of at least one byte, got {text!r}")
    return int(value)


def _answered_without_training(config: Any, say: bool = True) -> bool:
    """Return ``True`` when ``config``'s run folder holds that run finished, saying so if ``say``; JAX not imported."""
    from ember.cli._run_record import closing_line, finished_run

    summary = finished_run(Path(config.output), config)
    if summary is None:
        return False
    if not say:
        return True
    print(f"{config.output}: this run is already complete; nothing to do.")
    print(closing_line(summary))
    return True


def _status(summary: dict[str, Any]) -> int:
    """The exit status of a run: 0, 128 + a signal's number, or 1 when the update guard stopped it.

    A signal's stop can be resumed; the guard's (an epoch's worth of updates skipped in a row) means it is not training.
    """
    from ember.cli._run_record import SIGNAL_STATUS

    stopped = summary.get("stopped") or ""
    return 1 if stopped == "skipped updates" else SIGNAL_STATUS.get(stopped, 0)
