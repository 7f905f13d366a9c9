"""`engine.retiring` as a table: a host the run left, asked to stop what it ran there, answer
by answer (None: it stayed silent), until it is struck off the record."""

from __future__ import annotations

import pytest

from tfctl.engine.retiring import RETIRE_POLL, LeftBehind, Retiring, after_stop_asked

SURVIVE = "h2 answers again, but processes of the run survive SIGKILL there: 4242, 4243"
HUNG = (4242, 4243)
STOPPED = "h2 answers again: stopped the {} process(es) of the run it still had"


@pytest.mark.parametrize(
    "answers, said, struck_off_at",
    [
        ([None, None, None], [], None),  # frozen: asked again and again, nothing said
        ([None, LeftBehind(2)], [STOPPED.format(2)], 1),  # thawed with its two tasks: stopped, struck off
        ([LeftBehind(0)], [STOPPED.format(0)], 0),  # its tasks had ended meanwhile: struck off all the same
        (  # survivors in D state: said once, kept on the record until they are gone
            [
                LeftBehind(1, HUNG),
                LeftBehind(0, HUNG),
                None,
                LeftBehind(0, HUNG),
                LeftBehind(0),
            ],
            [SURVIVE, STOPPED.format(0)],
            4,
        ),
    ],
)
def test_a_left_host_is_asked_until_it_answers_with_nothing_left(answers, said, struck_off_at) -> None:
    state, shown, struck = Retiring("h2"), [], None
    for at, answer in enumerate(answers):
        step = after_stop_asked(state, answer)
        assert struck is None, "asked again after it was struck off"
        if step.say is not None:
            shown.append(step.say)
        if step.strike_off:
            struck = at
            assert step.ask_again_in is None  # done: the loop ends
        else:
            assert step.ask_again_in == RETIRE_POLL
        state = step.state
    assert (shown, struck) == (said, struck_off_at)
