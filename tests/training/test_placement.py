from pathlib import Path

import jax
import pytest

from ember.training import DataParallel, Pmap, SingleDevice, default_placement
from tests.subprocesses import SharedResults, eight_device_results

SCRIPT = Path(__file__).with_name("multidevice_script.py")


@pytest.fixture(scope="module")
def eight_devices() -> SharedResults:
    """The results of the multi-device script, run once with 8 simulated CPU devices."""
    return eight_device_results(SCRIPT)


@pytest.mark.parametrize("model", ["linen", "nnx", "mlp"])
def test_data_parallel_on_8_devices_matches_one_device(eight_devices, model):
    """The same global batches on 1 and 8 devices give the same params and model state (dropout and BN too)."""
    assert eight_devices["devices"] == 8
    assert eight_devices[f"{model}_dataparallel_params"] < 1e-5
    assert eight_devices[f"{model}_dataparallel_model_state"] < 1e-5
    assert eight_devices[f"{model}_dataparallel_k4_params"] < 1e-5
    assert eight_devices[f"{model}_dataparallel_sharding"] == "P()"


def test_pmap_on_8_devices_matches_one_device(eight_devices):
    """Pmap with averaged gradients trains like one device; the state stays one replicated array."""
    assert eight_devices["mlp_pmap_params"] < 1e-5
    assert eight_devices["mlp_pmap_k4_params"] < 1e-5
    assert eight_devices["pmap_state_sharding"] == "P()"
    assert eight_devices["pmap_loss_shape"] == []
    assert eight_devices["pmap_logits_shape"] == [8, 4, 3]


def test_pmap_averages_model_state_across_devices(eight_devices):
    """Batch statistics under pmap are averaged over devices and come back replicated, not stacked."""
    assert eight_devices["pmap_bn_stats_shape"] == [16]
    assert eight_devices["pmap_bn_stats_spec"] == "P()"
    assert eight_devices["pmap_nnx_steps"] == 12


def test_pmap_with_batch_norm_over_the_device_axis_matches_one_device(eight_devices):
    """BatchNorm(axis_name="batch") under Pmap uses the global batch statistics: one device's numbers."""
    assert eight_devices["pmap_sync_bn_params"] < 1e-5
    assert eight_devices["pmap_sync_bn_model_state"] < 1e-5


def test_metrics_on_8_devices_equal_one_device(eight_devices):
    """Epoch metrics (fused into the step under DataParallel, by handlers under pmap) equal one device's."""
    assert eight_devices["metrics_fused_counts"] == [3, 0]
    assert eight_devices["metrics_dataparallel_equal"] is True
    assert eight_devices["metrics_pmap_equal"] is True


def test_an_evaluation_batch_that_does_not_split_is_padded_and_masked(eight_devices):
    """A batch of 13 on 8 devices: padded to 16, masked; metrics equal one device's, with jit and with pmap."""
    assert eight_devices["eval_padded_dataparallel_equal"] is True
    assert eight_devices["eval_padded_pmap_equal"] is True
    assert eight_devices["eval_padded_needs_a_dict"] == (
        "A batch was padded to split over 8 devices, so the evaluator's output must be a dict, to carry the mask "
        'of the real examples under "mask"; got an array. Return a dict, or use an evaluation batch size '
        "divisible by 8."
    )


def test_a_batch_that_cannot_be_split_names_size_and_devices(eight_devices):
    """A batch of 12 on 8 devices is refused, naming both numbers."""
    assert eight_devices["indivisible_error"].startswith("A batch of size 12 cannot be split over 8 devices")


def test_default_placement_on_one_device_is_single_device():
    """With one visible device the default placement is SingleDevice."""
    assert len(jax.devices()) == 1
    assert isinstance(default_placement(), SingleDevice)
    assert repr(DataParallel()) == "DataParallel(1 devices, axis='data')"
    assert repr(Pmap()) == "Pmap(1 devices, axis_name='batch')"
    with pytest.raises(ValueError, match=r"`axis`='model' is not an axis of the mesh"):
        DataParallel(mesh=DataParallel().mesh, axis="model")


def test_multi_device_steps_on_cpu_are_awaited_and_accelerators_keep_async_dispatch():
    """Several CPU devices: the compiled call waits for its result; one device or a GPU: left as it is."""
    from ember.training._devices.placement import one_call_at_a_time

    cpu = jax.devices()[0]

    class Gpu:
        platform = "gpu"

    waited = []

    class Result:
        def block_until_ready(self):
            waited.append(True)
            return self

    def step(x):
        return Result()

    assert one_call_at_a_time(step, [cpu]) is step
    assert one_call_at_a_time(step, [Gpu(), Gpu()]) is step
    awaited = one_call_at_a_time(step, [cpu, cpu])
    assert awaited is not step
    assert isinstance(awaited(1), Result)
    assert waited == [True]


@pytest.mark.parametrize(
    ("precision", "name"),
    [
        ("16-mixed", "dataparallel"),
        ("16-mixed", "pmap"),
        ("16-mixed", "fsdp"),
        ("16-mixed", "dataparallel_k2_accumulate2"),
        ("bf16-true", "pmap"),
        ("bf16-true", "fsdp"),
    ],
)
def test_precision_policies_train_alike_on_every_placement(eight_devices, precision, name):
    """Six steps, the third overflowing float16: on 8 devices (K=2 and 2 micro-batches too) as on one.

    16-mixed skips the same one step everywhere; bf16-true keeps its parameters in bfloat16 everywhere.
    """
    diff, skipped, ref_skipped, dtype = eight_devices[f"precision_{precision}_{name}"]
    if precision == "16-mixed":
        assert (skipped, ref_skipped, dtype) == (1, 1, "float32")
        assert diff < 1e-4
    else:
        assert (skipped, dtype) == (None, "bfloat16")
        assert diff < 1e-3  # bfloat16 keeps 8 bits of mantissa: sums in another order differ in the last


def test_a_plan_under_fsdp_counts_each_devices_shards(eight_devices):
    """On 8 devices, the state's bytes per device in the plan (before and after building it) are one shard each."""
    assert eight_devices["plan_fsdp_devices"] == 8
    for planned, replanned, shards in eight_devices["plan_fsdp_state"]:
        assert planned == replanned == shards
