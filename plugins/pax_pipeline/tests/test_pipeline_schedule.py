"""The schedule's arithmetic and checks, and the stored weight layout."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pax_pipeline import Schedule
from pax_pipeline.schedule import stored_shape, to_stages


def test_gpipe_bubble_is_the_textbook_fraction():
    s = Schedule(num_stages=4, num_microbatches=8)
    assert (s.kind, s.microbatches(32), s.iterations(8)) == ("gpipe", 8, 11)
    assert s.bubble(8) == pytest.approx(3 / 11)


def test_circular_repeats_shrink_the_bubble():
    s = Schedule(num_stages=4, microbatch_size=2, circular_repeat=3)
    assert (s.kind, s.microbatches(16), s.iterations(8)) == ("circular", 8, 27)
    assert s.bubble(8) == pytest.approx(3 / 27)
    assert s.bubble(8) < Schedule(num_stages=4, num_microbatches=8).bubble(8)


def test_describe_reports_the_schedule_of_a_batch():
    facts = Schedule(num_stages=2, microbatch_size=4, stream_io=True).describe(32)
    assert facts == {"pipeline_schedule": "gpipe", "pipeline_stages": 2,
                     "pipeline_circular_repeat": 1, "pipeline_microbatches": 8,
                     "pipeline_microbatch_size": 4, "pipeline_iterations": 9,
                     "pipeline_bubble": pytest.approx(1 / 9), "pipeline_stream_io": True}


@pytest.mark.parametrize(("settings", "message"), [
    (dict(num_stages=2), "exactly one of num_microbatches and microbatch_size"),
    (dict(num_stages=2, num_microbatches=2, microbatch_size=2), "exactly one"),
    (dict(num_stages=0, num_microbatches=2), "num_stages must be at least 1"),
    (dict(num_stages=2, num_microbatches=0), "num_microbatches must be at least 1"),
    (dict(num_stages=2, num_microbatches=2, circular_repeat=0), "circular_repeat"),
])
def test_inconsistent_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        Schedule(**settings)


@pytest.mark.parametrize(("settings", "batch", "message"), [
    (dict(num_stages=2, microbatch_size=3), 8, "does not split into microbatches of 3"),
    (dict(num_stages=2, num_microbatches=3), 8, "does not split into 3 microbatches"),
    (dict(num_stages=4, num_microbatches=2, circular_repeat=2), 8,
     "at least as many microbatches as stages: 2 microbatches for 4 stages"),
    (dict(num_stages=4, num_microbatches=6, stream_io=True), 12, "STREAM_IO needs"),
])
def test_batches_that_do_not_fit_the_schedule_are_refused(settings, batch, message):
    with pytest.raises(ValueError, match=message):
        Schedule(**settings).microbatches(batch)


def test_layers_must_split_over_stages_and_repeats():
    Schedule(num_stages=2, num_microbatches=2, circular_repeat=3).check(18)
    with pytest.raises(ValueError, match="NUM_LAYERS must be a multiple of 6"):
        Schedule(num_stages=2, num_microbatches=2, circular_repeat=3).check(8)


def test_stage_layout_gives_each_stage_its_layer_groups():
    layers = jnp.arange(12)  # layer l stored at row l of an unpipelined stack
    gpipe = Schedule(num_stages=3, num_microbatches=3)
    np.testing.assert_array_equal(to_stages(layers, gpipe),
                                  [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
    circular = Schedule(num_stages=3, num_microbatches=3, circular_repeat=2)
    stored = layers.reshape(stored_shape(12, circular))
    # groups of 2 layers: group r*3 + s on stage s, in pass order
    np.testing.assert_array_equal(to_stages(stored, circular),
                                  [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5, 10, 11]])
