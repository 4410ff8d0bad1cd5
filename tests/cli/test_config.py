import re

import pytest

from ember.cli import Config, ConfigError, dump_config, load_config


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"trainer": {"max_epoch": 3}},
            "trainer.max_epoch: unknown field; did you mean 'max_epochs'? "
            "(allowed: compilation_cache, eval_every, max_epochs, max_iters, mesh, placement, precision, remat, "
            "rollback_after, rules, seed, skip_nonfinite, spike_factor, steps_per_call)",
        ),
        ({"optimiser": {}}, "optimiser: unknown field; did you mean 'optimizer'? "),
        (
            {"optimizer": {"name": "adamx"}},
            "optimizer.name: expected one of 'adamw', 'adam', 'sgd', 'lamb', got 'adamx'; did you mean 'adam'?",
        ),
        ({"trainer": {"max_epochs": "ten"}}, "trainer.max_epochs: expected an int, got 'ten' (str)."),
        ({"trainer": {"max_epochs": 0}}, "trainer.max_epochs: expected a positive int, got 0."),
        ({"trainer": {"max_epochs": True}}, "trainer.max_epochs: expected an int, got True (bool)."),
        ({"optimizer": {"clip_norm": "high"}}, "optimizer.clip_norm: expected a number, got 'high' (str)."),
        (
            {"handlers": {"writers": ["tensorboard", "tb"]}},
            "handlers.writers[1]: expected one of 'console', 'tensorboard', 'jsonl', 'csv', 'wandb', 'mlflow', "
            "got 'tb'.",
        ),
        (
            {"handlers": {"early_stopping": {"metric": "acc"}}},
            "handlers.early_stopping.metric: expected one of 'accuracy', 'loss', got 'acc'; did you mean 'accuracy'?",
        ),
        ({"data": 3}, "data: expected a mapping, got 3."),
        ({"optimizer": {"learning_rate": -0.1}}, "optimizer.learning_rate: expected a positive number, got -0.1."),
        ({"optimizer": {"learning_rate": 0}}, "optimizer.learning_rate: expected a positive number, got 0.0."),
        ({"optimizer": {"weight_decay": -1e-4}}, "optimizer.weight_decay: expected a number >= 0, got -0.0001."),
        (
            {"optimizer": {"clip_norm": 0}},
            "optimizer.clip_norm: expected a positive number (or null for no clipping), got 0.0.",
        ),
        ({"optimizer": {"momentum": 1}}, "optimizer.momentum: expected a number in [0, 1), got 1.0."),
        ({"optimizer": {"warmup_steps": -5}}, "optimizer.warmup_steps: expected an int >= 0, got -5."),
        ({"data": {"val_fraction": 1.0}}, "data.val_fraction: expected a number in (0, 1), got 1.0."),
        ({"trainer": {"spike_factor": 1}}, "trainer.spike_factor: expected a number > 1 (or null), got 1.0."),
        ({"trainer": {"rollback_after": 0}}, "trainer.rollback_after: expected a positive int, got 0."),
    ],
)
def test_config_errors_name_the_field_what_was_given_and_what_is_allowed(raw, message):
    with pytest.raises(ConfigError) as info:
        load_config(raw)
    assert str(info.value).startswith(message)


def test_yaml_round_trip_nulls_and_numbers(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optimizer:\n  learning_rate: 1\n  clip_norm: null\nhandlers:\n  early_stopping: null\n")
    config = load_config(path)
    assert config.optimizer.learning_rate == 1.0
    assert isinstance(config.optimizer.learning_rate, float)
    assert config.optimizer.clip_norm is None
    assert config.handlers.early_stopping is None
    again = tmp_path / "again.yaml"
    again.write_text(dump_config(config))
    assert load_config(again) == config
    assert load_config(None) == Config()


def test_bad_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [unclosed\n")
    with pytest.raises(ConfigError, match=re.escape(f"{bad}: not valid YAML")):
        load_config(bad)
    with pytest.raises(FileNotFoundError, match=re.escape(f"No config file at {tmp_path / 'nope.yaml'}.")):
        load_config(tmp_path / "nope.yaml")


def test_numbers_written_as_yaml_strings_are_read_as_numbers(tmp_path):
    """PyYAML reads 1e-3 (no dot) as a string: number fields take it as the number it spells."""
    path = tmp_path / "run.yaml"
    path.write_text("optimizer:\n  learning_rate: 1e-3\ntrainer:\n  max_epochs: '4'\n")
    config = load_config(path)
    assert (config.optimizer.learning_rate, config.trainer.max_epochs) == (0.001, 4)
    with pytest.raises(ConfigError, match=re.escape("optimizer.learning_rate: expected a number, got 'inf' (str).")):
        load_config({"optimizer": {"learning_rate": "inf"}})


def test_overrides_set_dotted_keys_typed_as_yaml_reads_them():
    """``key=value`` as ``ember train`` takes them: numbers, null, lists; a null section comes back."""
    config = load_config(
        {"handlers": {"early_stopping": None}},
        [
            "trainer.max_epochs=3",
            "optimizer.learning_rate=1e-3",
            "optimizer.clip_norm=null",
            "handlers.writers=[console, csv]",
            "handlers.early_stopping.patience=2",
            "model.args.width=64",
        ],
    )
    assert (config.trainer.max_epochs, config.optimizer.learning_rate, config.optimizer.clip_norm) == (3, 1e-3, None)
    assert config.handlers.writers == ["console", "csv"]
    assert config.handlers.early_stopping is not None
    assert (config.handlers.early_stopping.patience, config.handlers.early_stopping.metric) == (2, "accuracy")
    assert config.model.args == {"width": 64}


def test_every_mistake_in_a_config_is_reported_at_once():
    """File and overrides together: each problem with its dotted path, in the order met."""
    with pytest.raises(ConfigError) as caught:
        load_config(
            {"optimizer": {"name": "adamm", "momentum": 1.5}, "data": {"batch_size": 0}},
            ["trainer.max_epoch=3"],
        )
    assert str(caught.value) == (
        "4 problems in the config:\n"
        "  optimizer.name: expected one of 'adamw', 'adam', 'sgd', 'lamb', got 'adamm'; did you mean 'adam'?\n"
        "  optimizer.momentum: expected a number in [0, 1), got 1.5.\n"
        "  data.batch_size: expected a positive int, got 0.\n"
        "  trainer.max_epoch: unknown field; did you mean 'max_epochs'? "
        "(allowed: compilation_cache, eval_every, max_epochs, max_iters, mesh, placement, precision, remat, "
        "rollback_after, rules, seed, skip_nonfinite, spike_factor, steps_per_call)"
    )


def test_a_malformed_override_is_named():
    with pytest.raises(ConfigError, match=re.escape("override 'trainer.max_epochs': expected dotted.key=value")):
        load_config(None, ["trainer.max_epochs"])
    with pytest.raises(ConfigError, match=re.escape("override 'output.x=1': output is 'runs/digits', not a section")):
        load_config({"output": "runs/digits"}, ["output.x=1"])
    with pytest.raises(TypeError, match=re.escape("`overrides` must be a sequence of 'dotted.key=value' strings")):
        load_config(None, "trainer.max_epochs=3")  # type: ignore[arg-type]


def test_ember_train_reads_a_file_then_overrides(tmp_path, capsys):
    """``ember train CONFIG key=value``: both checked together, before anything trains."""
    from ember.cli import main

    path = tmp_path / "run.yaml"
    path.write_text("optimizer:\n  name: sgd\n  momentum: 2\n")
    assert main(["train", str(path), "trainer.max_epochs=0"]) == 2
    assert capsys.readouterr().err == (
        "ember: error: 2 problems in the config:\n"
        "  optimizer.momentum: expected a number in [0, 1), got 2.0.\n"
        "  trainer.max_epochs: expected a positive int, got 0.\n"
    )
    assert main(["train", str(path), str(path)]) == 2
    assert "ember train takes one config file, got" in capsys.readouterr().err


BOUNDS = [  # (dotted field, refused just outside the bound, accepted at it or just inside)
    ("optimizer.learning_rate", "0.0", "1e-12"),
    ("optimizer.weight_decay", "-1e-12", "0.0"),
    ("optimizer.clip_norm", "0.0", "1e-12"),
    ("optimizer.momentum", "-1e-12", "0.0"),
    ("optimizer.momentum", "1.0", "0.999999"),
    ("data.val_fraction", "0.0", "1e-06"),
    ("data.val_fraction", "1.0", "0.999999"),
    ("optimizer.warmup_steps", "-1", "0"),
    ("trainer.max_epochs", "0", "1"),
    ("trainer.steps_per_call", "0", "1"),
    ("trainer.eval_every", "0", "1"),
    ("data.batch_size", "0", "1"),
    ("handlers.log_every", "0", "1"),
    ("handlers.checkpoint.keep_latest", "0", "1"),
    ("handlers.checkpoint.every_iters", "0", "1"),
]


@pytest.mark.parametrize(("field", "outside", "inside"), BOUNDS)
def test_every_range_is_checked_on_both_sides_of_its_bound(field, outside, inside):
    """Just outside the bound: refused, naming the field and the value; at or just inside it: accepted."""
    with pytest.raises(ConfigError, match=rf"^{re.escape(field)}: expected "):
        load_config(None, [f"{field}={outside}"])
    config = load_config(None, [f"{field}={inside}"])
    section, _, name = field.rpartition(".")
    value = config
    for part in [*section.split("."), name]:
        value = getattr(value, part)
    assert value == float(inside)


def test_an_override_replaces_what_the_config_file_sets_and_leaves_the_rest(tmp_path):
    """The file sets a value and its neighbours; ``key=value`` replaces that value, not the section around it."""
    path = tmp_path / "run.yaml"
    path.write_text(
        "optimizer:\n  name: sgd\n  learning_rate: 0.5\n  momentum: 0.8\n"
        "handlers:\n  writers: [csv]\n  early_stopping: {patience: 9, metric: loss}\n"
    )
    config = load_config(
        path, ["optimizer.learning_rate=0.01", "handlers.writers=[jsonl]", "handlers.early_stopping.patience=2"]
    )
    assert (config.optimizer.name, config.optimizer.learning_rate, config.optimizer.momentum) == ("sgd", 0.01, 0.8)
    assert config.handlers.writers == ["jsonl"]
    assert (config.handlers.early_stopping.patience, config.handlers.early_stopping.metric) == (2, "loss")
