"""The ``ember`` command: ``train``, ``resume``, ``inspect``, ``plot`` and ``--version``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ember.cli._config import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ember`` command line; return the exit status.

    Examples:
        >>> from ember.cli import main
        >>> main(["--version"])  # doctest: +ELLIPSIS
        ember ...
        0
    """
    from ember import __version__

    parser = argparse.ArgumentParser(prog="ember", description="An event-driven training engine for JAX.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    p_train = sub.add_parser("train", help="train from a YAML config (none: the embedded digits run)")
    p_train.add_argument("config", nargs="?", help="a YAML config file")
    p_train.add_argument("--output", help="the run folder (overrides the config's output)")
    p_resume = sub.add_parser("resume", help="continue the run in RUN_DIR with the config saved there")
    p_resume.add_argument("run_dir")
    p_inspect = sub.add_parser("inspect", help="print what a checkpoint holds")
    p_inspect.add_argument("checkpoint", help="a checkpoint folder, or a folder of checkpoints (its latest)")
    p_plot = sub.add_parser("plot", help="draw a run's curves into a PNG")
    p_plot.add_argument("run_dir")
    p_plot.add_argument("--output", help="the PNG (default RUN_DIR/curves.png)")
    args = parser.parse_args(argv)
    if args.version:
        print(f"ember {__version__}")
        return 0
    try:
        if args.command == "train":
            from ember.cli._config import load_config
            from ember.cli._train import train

            config = load_config(args.config)
            if args.output:
                config.output = args.output
            train(config)
        elif args.command == "resume":
            from ember.cli._train import train

            saved = Path(args.run_dir) / "config.yaml"
            if not saved.exists():
                raise FileNotFoundError(f"{args.run_dir} has no config.yaml; is it a run folder of ember train?")
            train(saved)
        elif args.command == "inspect":
            from ember.cli._inspect import describe_checkpoint

            print(describe_checkpoint(args.checkpoint))
        elif args.command == "plot":
            from ember.cli._plot import plot_run

            print(plot_run(args.run_dir, args.output))
        else:
            parser.print_help()
            return 2
    except (ConfigError, FileNotFoundError, ValueError, ImportError) as e:
        print(f"ember: error: {e}", file=sys.stderr)
        return 2
    return 0
