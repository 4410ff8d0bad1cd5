"""Property-based tests (Hypothesis): random runs against a small reference model of the event order.

Each run has filtered handlers and up to three actions (terminate, terminate_epoch, interrupt, or a
state-dict resume in a new engine) at random iterations.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from ember import Engine, Events

ACTIONS = ("terminate", "terminate_epoch", "interrupt", "resume")


@dataclass(frozen=True)
class Scenario:
    length: int  # batches per epoch
    epochs: int
    iter_every: int  # a handler on ITERATION_COMPLETED(every=...)
    iter_once: int  # a handler on ITERATION_COMPLETED(once=...)
    epoch_every: int  # a handler on EPOCH_COMPLETED(every=...)
    actions: tuple[tuple[int, str], ...]  # (iteration, action), iterations increasing


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    length, epochs = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    total = length * epochs
    chosen = draw(st.lists(st.integers(1, total), max_size=3, unique=True).map(sorted))
    actions = []
    for it in chosen:
        action = draw(st.sampled_from(ACTIONS))
        if action == "resume" and any(a == "terminate_epoch" for _, a in actions):
            action = "interrupt"  # a state dict cannot say where in a shortened epoch a run stands (documented)
        actions.append((it, action))
    return Scenario(
        length,
        epochs,
        draw(st.integers(1, 5)),
        draw(st.integers(1, total + 1)),
        draw(st.integers(1, 3)),
        tuple(actions),
    )


def expected(s: Scenario) -> list[str]:
    """The reference model: the events the engine must fire, as in docs/concepts/events.md."""
    log: list[str] = []
    pending = dict(s.actions)
    iteration, epoch, once_fired = 0, 0, False
    started = False

    def iteration_handlers(i: int) -> None:
        nonlocal once_fired
        log.append(f"ITERATION_COMPLETED {i}")
        if i % s.iter_every == 0:
            log.append(f"every {i}")
        if i == s.iter_once and not once_fired:
            once_fired = True
            log.append(f"once {i}")

    def epoch_completed(e: int) -> None:
        log.append(f"EPOCH_COMPLETED {e}")
        if e % s.epoch_every == 0:
            log.append(f"epoch every {e}")

    pos = 0  # iterations done in the current epoch
    epoch_open = False
    while True:
        if not started:
            log.append("STARTED")
            started = True
        if not epoch_open:
            if epoch >= s.epochs:
                log.append("COMPLETED")
                return log
            epoch, pos, epoch_open = epoch + 1, 0, True
            log.append(f"EPOCH_STARTED {epoch}")
        if pos == s.length:  # an epoch whose last iteration ran before a terminate or a resume
            epoch_completed(epoch)
            epoch_open = False
            continue
        iteration, pos = iteration + 1, pos + 1
        iteration_handlers(iteration)
        action = pending.pop(iteration, None)
        if action == "terminate":
            log += ["TERMINATE", "COMPLETED"]
            started = False  # run() again: STARTED again, the epoch continues
        elif action == "interrupt":
            log.append("INTERRUPT")  # run() again: no STARTED
        elif action == "resume":
            log.append("TERMINATE")  # this engine stops (skip_completed); a new one loads the state dict
            started = False
            once_fired = False  # the new engine's handlers are new registrations
        elif action == "terminate_epoch":
            log.append("TERMINATE_SINGLE_EPOCH")
            epoch_completed(epoch)
            epoch_open = False
            continue
        if pos == s.length and action not in ("terminate", "resume"):  # the epoch ends normally
            epoch_completed(epoch)
            epoch_open = False


def attach(engine: Engine, s: Scenario, log: list[str], saved: list[dict]) -> None:
    actions = dict(s.actions)

    def act(e: Engine) -> None:
        action = actions.get(e.state.iteration)
        if action == "terminate":
            e.terminate()
        elif action == "terminate_epoch":
            e.terminate_epoch()
        elif action == "interrupt":
            e.interrupt()
        elif action == "resume":
            saved.append(e.state_dict())
            e.terminate(skip_completed=True)

    it, ep = Events.ITERATION_COMPLETED, Events.EPOCH_COMPLETED
    engine.add_event_handler(it, lambda e: log.append(f"ITERATION_COMPLETED {e.state.iteration}"))
    engine.add_event_handler(it(every=s.iter_every), lambda e: log.append(f"every {e.state.iteration}"))
    engine.add_event_handler(it(once=s.iter_once), lambda e: log.append(f"once {e.state.iteration}"))
    engine.add_event_handler(it, act)
    engine.add_event_handler(ep, lambda e: log.append(f"EPOCH_COMPLETED {e.state.epoch}"))
    engine.add_event_handler(ep(every=s.epoch_every), lambda e: log.append(f"epoch every {e.state.epoch}"))
    for name in ("STARTED", "COMPLETED", "TERMINATE", "TERMINATE_SINGLE_EPOCH", "INTERRUPT"):
        engine.add_event_handler(Events[name], lambda e, name=name: log.append(name))
    engine.add_event_handler(Events.EPOCH_STARTED, lambda e: log.append(f"EPOCH_STARTED {e.state.epoch}"))


def actual(s: Scenario) -> list[str]:
    """Drive the engine: run, and after an interrupt or terminate run again, or resume in a new engine."""
    data = list(range(s.length))
    log: list[str] = []
    saved: list[dict] = []
    engine = Engine(lambda e, b: b)
    attach(engine, s, log, saved)
    engine.run(data, max_epochs=s.epochs)
    for _ in range(10):  # at most 3 actions, each needing one more run
        if saved:  # a new engine (a new process) from the state dict taken at the resume action
            engine = Engine(lambda e, b: b)
            attach(engine, s, log, saved)
            engine.load_state_dict(saved.pop())
        elif log[-1] == "COMPLETED" and log[-2] != "TERMINATE":
            break  # finished normally
        engine.run(data)
    return log


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_the_engine_fires_what_the_reference_model_predicts(s: Scenario):
    assert actual(s) == expected(s)
