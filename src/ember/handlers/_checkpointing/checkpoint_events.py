"""`CheckpointEvents`: what a `Checkpoint` fires on its engine once it has saved (Ignite's ``SAVED_CHECKPOINT``)."""

from __future__ import annotations

from ember.engine import Engine, EventEnum


class CheckpointEvents(EventEnum):
    """Events a [`Checkpoint`][ember.handlers.Checkpoint] fires on the engine it saves on (Ignite's, by its name).

    ``SAVED_CHECKPOINT`` fires after each checkpoint the handler writes (retention admitted it), on the training
    thread; into a store with background writes the checkpoint is then scheduled, its arrays copied, and
    ``saver.wait()`` returns once it is on disk; ``engine.last_event_name`` stays the event that saved. The handler
    registers the event on its engine at its first save, or at ``attach`` (Ignite registers it at the first save
    only): to handle it before, register it yourself with ``engine.register_events(*CheckpointEvents)``. Also
    reachable as ``Checkpoint.SAVED_CHECKPOINT``.

    Examples:
        >>> import tempfile
        >>> from ember import Engine, Events
        >>> from ember.handlers import Checkpoint
        >>> trainer = Engine(lambda e, b: b)
        >>> saver = Checkpoint({"trainer": trainer}, tempfile.mkdtemp())
        >>> _ = saver.attach(trainer, Events.EPOCH_COMPLETED)
        >>> @trainer.on(Checkpoint.SAVED_CHECKPOINT)
        ... def saved(engine):
        ...     print("saved at epoch", engine.state.epoch)
        >>> _ = trainer.run([1, 2], max_epochs=2)
        saved at epoch 1
        saved at epoch 2
    """

    SAVED_CHECKPOINT = "saved_checkpoint"


def registered(engine: Engine) -> Engine:
    """``engine``, with `CheckpointEvents` registered on it (once)."""
    if not engine.has_registered_events(CheckpointEvents.SAVED_CHECKPOINT):
        engine.register_events(*CheckpointEvents)
    return engine


def announce_saved(engine: Engine) -> None:
    """Fire ``SAVED_CHECKPOINT`` on ``engine`` within the event that saved; ``last_event_name`` stays that event.

    (Ignite's ``fire_event`` leaves it at ``SAVED_CHECKPOINT``; ember's handlers after the save read it to know where
    the run is: a save at COMPLETED, the epoch a preemption stopped in.)
    """
    during = engine.last_event_name
    registered(engine).fire_event(CheckpointEvents.SAVED_CHECKPOINT)
    engine.last_event_name = during
