"""Sharded training (``Sharded``, ``fsdp``) on 8 simulated CPU devices, against one device."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from ember.training import Sharded, TrainState, fsdp
from tests.subprocesses import SharedResults, eight_device_results

SCRIPT = Path(__file__).with_name("sharded_script.py")


@pytest.fixture(scope="module")
def eight_devices() -> SharedResults:
    """The results of the sharded script, run once with 8 simulated CPU devices."""
    return eight_device_results(SCRIPT)


@pytest.mark.parametrize("model", ["linen", "nnx"])
@pytest.mark.parametrize("steps", ["k1", "k4_acc2"])
def test_fsdp_on_8_devices_equals_one_device(eight_devices, model, steps):
    """20 steps with dropout and batch norm, SGD with momentum: parameters, state and norms to 1e-5."""
    assert eight_devices["devices"] == 8
    key = f"{model}_momentum_{steps}"
    for part in ("params", "opt_state", "model_state"):
        assert eight_devices[f"{key}_{part}"] < 1e-5, (part, eight_devices[f"{key}_{part}"])
    assert eight_devices[f"{key}_norms"] < 1e-5  # grad, param and update norms, reduced across shards in the step
    one, sharded = eight_devices[f"{key}_metrics"]
    assert sharded == pytest.approx(one, rel=1e-5)


@pytest.mark.parametrize("model", ["linen", "nnx"])
def test_fsdp_with_adam_stays_within_one_devices_own_spread(eight_devices, model):
    """Adam's parameters within twice the spread of one device against itself data parallel on 8.

    Adam divides by sqrt(v): tiny gradients amplify rounding. The spread is 1 device against the same run
    data parallel on 8 (the same sums, reduced in another order).
    """
    spread = eight_devices[f"{model}_adam_spread"]
    assert 0 < spread < 1e-2
    assert eight_devices[f"{model}_adam_k1_params"] <= 2 * spread
    assert eight_devices[f"{model}_adam_k1_opt_state"] < 1e-5  # moments of sharded params, exactly placed


def test_fsdp_shards_the_model_annotations_first_then_the_automatic_rule(eight_devices):
    """NNX's own annotation wins (dense2: P(None, 'fsdp')); elsewhere the largest divisible dimension is split."""
    assert eight_devices["nnx_specs"] == {
        "['bn']['bias'].value": "P()",
        "['bn']['scale'].value": "P()",
        "['dense1']['bias'].value": "P()",
        "['dense1']['kernel'].value": "P(None, 'fsdp')",
        "['dense2']['bias'].value": "P()",
        "['dense2']['kernel'].value": "P(None, 'fsdp')",
        "['dense3']['bias'].value": "P()",
        "['dense3']['kernel'].value": "P('fsdp',)",
    }
    assert eight_devices["linen_specs"]["['Dense_1']['kernel']"] == "P('fsdp',)"  # (256, 256): the first of two


@pytest.mark.parametrize("model", ["linen", "nnx"])
def test_fsdp_holds_an_eighth_of_params_and_optimizer_state_per_device(eight_devices, model):
    """Per device, params + optimizer state (summed over addressable shards) <= 1.25 x total / 8."""
    held = eight_devices[f"{model}_bytes"]
    assert held["devices"] == 8
    ratio = held["per_device_max"] / (held["total"] / 8)
    assert ratio <= 1.25, f"{held['per_device_max']} bytes on one device, {held['total']} in all: {ratio:.3f} x 1/8"


def test_an_evaluator_on_a_sharded_trainer_matches_one_device(eight_devices):
    assert eight_devices["eval_accuracy"][0] == eight_devices["eval_accuracy"][1]


def test_tensor_parallel_2x4_transformer_block_equals_one_device(eight_devices):
    """Attention heads and the MLP's hidden units split over 'model', the batch over 'data': equal to 1e-5."""
    assert eight_devices["tp_params"] < 1e-5
    assert eight_devices["tp_batch_axes"] == ["data"]
    specs = eight_devices["tp_specs"]
    assert specs["['attention']['query']['kernel']"] == "P(None, 'model')"
    assert specs["['attention']['out']['kernel']"] == "P('model',)"
    assert specs["['mlp_in']['kernel']"] == "P(None, 'model')"
    assert specs["['mlp_out']['kernel']"] == "P('model',)"
    assert specs["['LayerNorm_0']['scale']"] == "P()"  # no rule, no automatic rule: replicated


def test_sharded_bad_input_is_named_before_the_first_step(eight_devices):
    assert eight_devices["errors"] == {
        "rule_axis": "ValueError: The rule 'kernel' names the mesh axis 'model', but the mesh has only the axes "
        "('fsdp',).",
        "rule_divisible": "ValueError: The rule 'params\\\\.w' splits params.w (shape (3, 5)) over 'fsdp' of size 8, "
        "which does not divide its dimension of 3.",
        "fsdp_axis": "ValueError: `fsdp_axis`='data' is not an axis of the mesh, whose axes are ('fsdp',).",
        "batch": "ValueError: A batch of size 12 cannot be split over 8 devices; use a batch size divisible by 8 "
        "(drop_remainder=True drops a short last batch), or fewer devices.",
        "logical": "ValueError: The model partitions params.kernel over 'mlp', which is neither an axis of the mesh "
        "('fsdp',) nor a name in logical_rules ['embed'].",
        "unmatched_rule": "ValueError: The rule 'Dense_0\\\\.kernl' matches no array of the train state, so it places "
        "nothing (a typo?). Rules are searched in the dotted paths: params.BatchNorm_0.bias, params.BatchNorm_0.scale, "
        "params.Dense_0.bias, params.Dense_0.kernel, params.Dense_1.bias, params.Dense_1.kernel, params.Dense_2.bias, "
        "params.Dense_2.kernel, ...",
        "unused_logical_name": "ValueError: `logical_rules` names 'mlpp', which no parameter of the model carries (a "
        "typo?); the model's names are ['embed', 'heads', 'mlp', 'vocab'].",
    }
    assert eight_devices["auto_summary"] == (
        "Sharded: mesh {'fsdp': 8}, batch over ('fsdp',)\n  params.w (3, 5): no dimension divisible by 'fsdp' (8); "
        "replicated\n  the fullest device holds 2.3 x total/8 (1 of 2 arrays replicated, counting those of 1 elements "
        "or more)"
    )
    assert eight_devices["auto_warning"] == [
        "The fullest device holds 2.3 x total/8 of the arrays meant to split over 8 devices (1 of 2 arrays replicated, "
        "counting those of 1 elements or more). Map the model's logical names to a mesh axis, add rules, or raise "
        "`min_size`; placement.layout(state) lists every array."
    ]


@pytest.mark.parametrize("model", ["linen", "nnx"])
def test_the_same_logical_rules_shard_a_linen_and_an_nnx_transformer_alike(eight_devices, model):
    """A transformer written in linen and in NNX, one logical_rules on 4 x 2: as on one device, each layer alike."""
    lm = eight_devices["lm"][model]
    assert lm["params"] < 1e-5
    specs = lm["specs"]
    embedding = "params.Embed_0.embedding" if model == "linen" else "params.embed.embedding"
    assert specs[embedding] == "P(None, 'fsdp')"  # ("vocab", "embed")
    for layer in ("query", "key", "value", "up"):
        assert specs[f"params.{layer}.kernel"] == "P('fsdp', 'model')"
    for layer in ("out", "down"):
        assert specs[f"params.{layer}.kernel"] == "P('model', 'fsdp')"
    assert specs["params.logits.kernel"] == "P('fsdp', None)"
    rows = lm["table_rows"]
    assert rows[0] == ["array", "shape", "spec", "bytes per device"]
    assert ["params.up.kernel", "(32, 128)", "P('fsdp', 'model')", "2,048"] in rows  # 32 x 128 x 4 bytes / 8


def test_fsdp_takes_logical_rules_and_a_placement_that_replicates_says_so(eight_devices):
    """fsdp(logical_rules=...) places by the model's names; names all mapped to None: a warning, and the summary."""
    assert eight_devices["fsdp_logical"] == "P('fsdp', None)"  # ("embed", "mlp") -> ("fsdp", None)
    assert eight_devices["replicated_warning"] == [
        "The fullest device holds 8.0 x total/8 of the arrays meant to split over 8 devices (8 of 8 arrays "
        "replicated, counting those of 1,024 elements or more). Map the model's logical names to a mesh axis, add "
        "rules, or raise `min_size`; placement.layout(state) lists every array."
    ]
    assert eight_devices["replicated_summary"].endswith(
        "\n  the fullest device holds 8.0 x total/8 (8 of 8 arrays replicated, counting those of 1,024 elements or "
        "more)"
    )


def test_sharded_argument_checks_in_process():
    """Wrong types and names fail at construction, naming the argument."""
    mesh = Mesh(np.array(jax.devices()[:1]), ("fsdp",))
    with pytest.raises(TypeError, match=r"`mesh` must be a jax.sharding.Mesh, got list\."):
        Sharded([1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`rules` must hold \(regex, PartitionSpec\) pairs, got \('w', 'fsdp'\)\."):
        Sharded(mesh, rules=(("w", "fsdp"),))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`batch_axes` names 'data', but the mesh has only the axes \('fsdp',\)\."):
        Sharded(mesh, batch_axes=("data",))
    with pytest.raises(ValueError, match=r"`min_size` must be a non-negative int, got -1\."):
        fsdp(min_size=-1)


def test_rules_match_the_dotted_path_first_match_wins():
    """On a one-device mesh the specs are resolved all the same: first matching rule, then the automatic one."""
    mesh = Mesh(np.array(jax.devices()[:1]), ("fsdp",))
    rules = ((r"params\.w", P("fsdp", None)), (r"params\.[vw]", P(None, "fsdp")))
    placement = Sharded(mesh, rules=rules, fsdp_axis="fsdp", min_size=1)
    params = {"w": jnp.zeros((4, 2)), "v": jnp.zeros((4, 2)), "b": jnp.zeros(3)}
    state = TrainState.create(lambda p, x: x, params, optax.adam(1e-3))
    shardings = placement.state_shardings(state)
    specs = {k: s.spec for k, s in shardings.params.items()}
    assert specs == {"w": P("fsdp", None), "v": P(None, "fsdp"), "b": P("fsdp")}  # b: the automatic rule
    assert shardings.opt_state[0].mu["w"].spec == P("fsdp", None)  # moments follow their parameter
    assert shardings.opt_state[0].count.spec == P()
    assert shardings.step.spec == P()
    too_many = Sharded(mesh, rules=((r"params\.b", P(None, "fsdp")),))
    with pytest.raises(ValueError, match=r"gives params\.b of shape \(3,\) the spec P\(None, 'fsdp'\), with more"):
        too_many.state_shardings(state)


def test_sharded_resume_on_the_same_mesh_is_bit_exact(eight_devices):
    """FSDP on 8: 8 steps, an orbax checkpoint, a new trainer resumes and trains 12 more = 20 straight, bit for bit."""
    assert eight_devices["resume_step"] == 8
    assert eight_devices["resume_bit_exact"] == 0.0
    assert eight_devices["resume_sharding_kept"] == "P('fsdp',)"


def test_a_sharded_checkpoint_restores_onto_another_mesh(eight_devices):
    """Saved with FSDP on 8 devices; restored on 4, on 1 and on a 2x4 (data x model) mesh: equal, and trains on."""
    assert eight_devices["elastic"] == {
        "fsdp4": {"equal": 0.0, "spec": "P('fsdp', None)", "devices": 4, "trained_on": 4},
        "one": {"equal": 0.0, "spec": "one device", "devices": 1, "trained_on": 4},
        "tp2x4": {"equal": 0.0, "spec": "P(None, 'model')", "devices": 8, "trained_on": 4},
    }


def test_stock_handlers_and_iterate_work_on_a_sharded_trainer(eight_devices):
    """ParamStats counts from shapes, the spike monitor and NaN check read device flags, evaluation stops early."""
    assert eight_devices["handlers"] == {"params": 76808, "spikes": [], "iterate": [14, 16]}


def test_the_average_of_the_parameters_is_sharded_as_they_are(eight_devices):
    """ember.training.ema keeps it in the optimizer state: each averaged leaf has its parameter's sharding."""
    pairs = eight_devices["ema_specs"]
    assert all(param == average for param, average in pairs), pairs
    assert "P('fsdp',)" in {param for param, _ in pairs}


def test_the_range_test_and_a_plateau_scale_work_on_sharded_state(eight_devices):
    """lr_find leaves the trainer's sharded state untouched; the plateau's scale applies; the state stays sharded."""
    assert eight_devices["tuning"] == {"tried": 8, "untouched": True, "scale": 0.5, "kernel_spec": "P('fsdp',)"}


def test_init_from_puts_each_leaf_onto_the_sharded_targets_own_sharding(eight_devices):
    """A one-device run's weights onto an FSDP state: the target's shardings kept, the values the source's."""
    started = eight_devices["init_from"]
    body = [f"params.{layer}.{p}" for layer in ("Dense_0", "Dense_1") for p in ("bias", "kernel")]
    assert started["loaded"] == ["params.BatchNorm_0.bias", "params.BatchNorm_0.scale", *body]
    assert started["fresh"] == ["params.Dense_2.bias", "params.Dense_2.kernel"]
    assert started["same_sharding"] is True
    assert started["equal"] is True
    assert started["head_fresh"] is True
    assert started["kernel_spec"] == "P('fsdp', None)"  # sharded: the check above is not of replicated leaves
